"""runtime: docker hosts on the emulated network, as a user runs them: `testbed net up` in one process,
probes from others, `net down` / `clean` after (also after the builder was SIGKILLed)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.network import cleanup, docker_hosts
from tests.conftest import REPO, cli_env, run_cli
from tests.docker.conftest import require_docker
from tests.network.helpers import require_root_tools

pytestmark = [pytest.mark.root]

DELAY_MS = 15


def write_topo(tmp_path: Path, image: str, **dc: object) -> Path:
    import yaml

    topo = {"name": "dk2", "defaults": {"hosts": 1},
            "dcs": [{"name": "a", "runtime": "docker", "image": image, "cpu": 0.5, "memory": "256MiB", **dc},
                    {"name": "b"}],
            "links": [{"a": "a", "b": "b", "rate": "20Mbit", "delay": f"{DELAY_MS}ms"}]}
    path = tmp_path / "dk2.yaml"
    path.write_text(yaml.safe_dump(topo))
    return path


def spec_path(tmp_path: Path, image: str) -> Path:
    return write_topo(tmp_path, image)


def inspect(name: str) -> dict:
    r = subprocess.run(["docker", "inspect", name], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)[0]


def eth0_counters_in_container(name: str) -> tuple[int, int]:
    """(rx, tx) packets of eth0 as the container itself sees them (its own /proc/net/dev)."""
    out = subprocess.run(["docker", "exec", name, "cat", "/proc/net/dev"], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("eth0:"):
            f = line.split(":", 1)[1].split()
            return int(f[1]), int(f[9])
    raise AssertionError(f"no eth0 in the container: {out}")


def test_a_container_host_is_on_the_shaped_lan_and_leaves_nothing(tmp_path, busybox_image):
    require_root_tools()
    assert not cleanup.owned_netns() and not docker_hosts.owned(), "a testbed network is already up"
    spec = write_topo(tmp_path, busybox_image)
    r = run_cli("net", "up", str(spec), "--impairment", "userspace", timeout=180)
    try:
        assert r.returncode == 0, r.stderr
        c = inspect("tb-a-h1")
        assert c["State"]["Running"] and c["HostConfig"]["NetworkMode"] == "none"
        assert c["HostConfig"]["CapDrop"] == ["ALL"] and not c["HostConfig"]["Privileged"]
        assert c["HostConfig"]["NanoCpus"] == 5 * 10**8 and c["HostConfig"]["Memory"] == 256 * 2**20
        assert c["Config"]["Labels"][docker_hosts.LABEL] == "tb"
        # the node's namespace is the container's
        pid = c["State"]["Pid"]
        assert Path(f"/proc/{pid}/ns/net").stat().st_ino == Path("/run/netns/tb-a-h1").stat().st_ino
        # the WAN's delay applies to it: ping from the container's namespace, a separate process
        rx0, tx0 = eth0_counters_in_container("tb-a-h1")
        r = run_cli("net", "exec", "a-h1", "--", "ping", "-n", "-c", "20", "-i", "0.05", "10.2.0.1", timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        rtt_min = float(re.search(r"= ([\d.]+)/", r.stdout).group(1))
        assert 2 * DELAY_MS <= rtt_min <= 2 * DELAY_MS + 5, r.stdout
        # ... and its packets are the container's own: its eth0 counted all 20 requests and replies
        rx1, tx1 = eth0_counters_in_container("tb-a-h1")
        assert tx1 - tx0 >= 20 and rx1 - rx0 >= 20, (rx0, rx1, tx0, tx1)
        # the rate too (net show reads the tc state back from the container's namespace)
        shown = json.loads(run_cli("net", "show", "--json", check=True).stdout)
        assert "a-h1" in json.dumps(shown)
        # --container: the command runs inside the container as a trainer does (its PID namespace, whose first
        # process is the keepalive; its files; its cgroups, so its --cpus/--memory limit it); without it,
        # only the network namespace is the container's
        inside = run_cli("net", "exec", "--container", "a-h1", "--", "sh", "-c",
                         "tr '\\0' ' ' < /proc/1/cmdline; echo; ls /bin | wc -l; cat /proc/self/cgroup", timeout=60)
        assert inside.returncode == 0, inside.stderr
        first, nbin, *groups = inside.stdout.splitlines()
        assert first.split() == ["sleep", "1000000000"], inside.stdout
        assert int(nbin) <= 5, inside.stdout  # the busybox image's /bin, not this machine's
        cid = c["Id"]
        assert any(":memory:" in g and cid in g for g in groups), groups
        outside = run_cli("net", "exec", "a-h1", "--", "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline", timeout=60)
        assert outside.returncode == 0 and "sleep" not in outside.stdout, outside.stdout
        # a process host or router has no container: named, exit 2
        bad = run_cli("net", "exec", "--container", "b-h1", "--", "true", timeout=60)
        assert bad.returncode == 2 and "not a container host" in bad.stderr, bad.stderr
    finally:
        down = run_cli("net", "down", timeout=120)
    assert down.returncode == 0, down.stderr
    assert "containers: 1" in down.stdout + down.stderr
    assert docker_hosts.owned() == [] and cleanup.leftovers() == {}


def test_a_builder_killed_while_it_starts_containers_is_cleaned_up(tmp_path, busybox_image):
    require_root_tools()
    spec = write_topo(tmp_path, busybox_image)
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "net", "up", str(spec), "--impairment", "userspace"],
                         cwd=REPO, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not docker_hosts.owned() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    r = run_cli("clean", timeout=120)
    assert r.returncode == 0, r.stderr
    assert docker_hosts.owned() == [] and cleanup.leftovers() == {}


@pytest.mark.parametrize("case", ["missing image", "image without python"])
def test_bad_images_are_refused_before_anything_is_built(tmp_path, busybox_image, case):
    require_root_tools()
    if case == "missing image":
        spec = write_topo(tmp_path, "geo-testbed/no-such-image:0")
        r = run_cli("net", "up", str(spec), "--impairment", "userspace", timeout=60)
        assert r.returncode == 2 and "dcs[a].image" in r.stderr and "fix:" in r.stderr, r.stderr
    else:
        r = run_cli("image", "check", busybox_image, timeout=120)
        assert r.returncode == 2 and "python3" in r.stderr and "testbed image build" in r.stderr, r.stderr
        # an experiment on it is refused before its first network is built
        import yaml

        exp = tmp_path / "exp.yaml"
        exp.write_text(yaml.safe_dump({"name": "noimage", "topology": str(spec_path(tmp_path, busybox_image)),
                                       "impairment": "userspace",
                                       "training": {"workload": {"name": "digits"}, "stop": {"steps": 5}},
                                       "schemes": [{"label": "bsp", "scheme": {"name": "bsp"}}]}))
        r = run_cli("run", str(exp), "--results", str(tmp_path / "res"), timeout=120)
        assert r.returncode == 2 and "dcs[a].image" in r.stderr and "python3" in r.stderr, r.stderr
        assert not (tmp_path / "res").exists() or not list((tmp_path / "res").rglob("manifest.json"))
    assert docker_hosts.owned() == [] and cleanup.leftovers() == {}


def test_docker_not_running_is_a_clear_error(tmp_path, monkeypatch):
    """The check a spec with runtime: docker meets first, with the daemon unreachable (a socket that is not)."""
    require_docker()
    from testbed.network.emulation import check_docker_hosts
    from topologies import load

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    topo = load(str(write_topo(tmp_path, "x/y:1")))
    with pytest.raises(docker_hosts.DockerError) as e:
        check_docker_hosts(topo)
    assert "not running" in str(e.value) and "dockerd" in str(e.value)
