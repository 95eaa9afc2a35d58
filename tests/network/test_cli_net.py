"""The `testbed` command on this machine: net up --dry-run, net up / show --json / down, doctor --json."""

from __future__ import annotations

import json

import pytest

from testbed.network import cleanup
from tests.conftest import run_cli
from tests.network.helpers import require_root_tools
from topologies import load
from traffic_control import LinkShape

pytestmark = pytest.mark.root


def test_dry_run_prints_tc_commands_and_creates_nothing():
    require_root_tools()
    before = cleanup.leftovers()
    t = load("three_dc_triangle")
    lan = LinkShape(rate_bps=1e9)
    for backend in ("netem", "userspace"):
        r = run_cli("net", "up", "three_dc_triangle", "--dry-run", "--impairment", backend)
        assert r.returncode == 0, r.stderr
        out = r.stdout
        assert f"# impairment backend: {backend}" in out
        for lk in t.links:
            for src, dst, shape in ((lk.a, lk.b, lk.forward), (lk.b, lk.a, lk.reverse)):
                prefix = f"ip netns exec tb-{src}-r tc "
                assert f"{prefix}qdisc add dev w-{dst} root handle 1: htb default 1" in out
                assert f"{prefix}class add dev w-{dst} parent 1: classid 1:1 htb rate {int(shape.rate_bps / 1e6)}mbit" in out
                if backend == "netem":
                    assert (f"{prefix}qdisc add dev w-{dst} parent 1:1 handle 10: netem delay "
                            f"{int(round(shape.delay_s * 1e6))}us limit {shape.netem_limit}") in out
                else:  # the delay is a daemon's, said so; the leaf holds the rate's queue
                    assert f"{prefix}qdisc add dev w-{dst} parent 1:1 handle 10: pfifo limit {shape.netem_limit}" in out
                    assert (f"ip netns exec tb-{src}-r python -m traffic_control.userspace run --ifname w-{dst} "
                            "--state-dir STATE_DIR  # detached NFQUEUE daemon") in out
                    assert (f"ip netns exec tb-{src}-r iptables -w -t mangle -A POSTROUTING -o w-{dst} ") in out
        # LAN rate on both ends: the host's egress and its port on the switch (in the switch's namespace)
        assert (f"ip netns exec tb-east-h1 tc class add dev eth0 parent 1: classid 1:1 htb rate 1gbit ceil 1gbit "
                f"burst {lan.burst_bytes}b") in out
        assert (f"ip netns exec tb-east-sw tc class add dev east-h1 parent 1: classid 1:1 htb rate 1gbit ceil 1gbit "
                f"burst {lan.burst_bytes}b") in out
        assert "10.1.0.254" in out and "switch east: bridge tb-east in netns tb-east-sw" in out
    assert cleanup.leftovers() == before


def test_up_show_down():
    require_root_tools()
    assert not cleanup.owned_netns(), "a testbed network is already up"
    r = run_cli("net", "up", "two_dc", "--impairment", "none", "--allow-missing-netem", timeout=180)
    try:
        assert r.returncode == 0, r.stderr
        assert "SKIPPED" in r.stderr  # the delay that was not applied is said out loud
        assert "tb-east-r" in cleanup.owned_netns()
        r = run_cli("net", "show", "--json")
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        assert d["state"]["topology"]["name"] == "two_dc"
        assert d["state"]["impairment"]["backend"] == "none" and d["state"]["impairment"]["skipped"]
        tc = d["tc"]
        assert set(tc) == {"east-r:w-west", "west-r:w-east"}
        for v in tc.values():
            assert v["shape"]["rate_bps"] == pytest.approx(100e6)
        r = run_cli("net", "show")
        assert r.returncode == 0 and "two_dc" in r.stdout
        # a second `net up` refuses and leaves the running network alone
        r2 = run_cli("net", "up", "two_dc", "--impairment", "none")
        assert r2.returncode != 0 and "already up" in r2.stderr
        assert "tb-east-r" in cleanup.owned_netns()
        until_eof_ends_the_command_when_stdin_closes()
    finally:
        r = run_cli("net", "down")
    assert r.returncode == 0, r.stderr
    assert cleanup.leftovers() == {}
    r = run_cli("net", "show", "--json")
    assert r.returncode == 1


def test_doctor_json():
    require_root_tools()
    r = run_cli("doctor", "--json", timeout=180)
    assert r.returncode in (0, 1), r.stderr
    d = json.loads(r.stdout)
    caps = {c["name"]: c for c in d["capabilities"]}
    for name in ("root", "netns", "veth", "bridge", "htb", "netem", "iperf3", "python:pyroute2"):
        assert name in caps, name
    assert caps["root"]["ok"] and caps["htb"]["ok"] and caps["veth"]["ok"]
    netem = caps["netem"]
    if not netem["ok"]:
        assert "modprobe sch_netem" in netem["fix"] and "lab" in netem["fix"]
    assert all({"name", "ok", "detail", "fix", "optional"} <= set(c) for c in d["capabilities"])
    assert not [n for n in cleanup.owned_netns() if n.startswith("tb-probe")]


def test_verify_quick_is_the_trials_self_test():
    """`net verify --quick` from the command line: the per-trial self-test, rates checked, in seconds."""
    require_root_tools("ping")
    assert not cleanup.owned_netns(), "a testbed network is already up"
    r = run_cli("net", "verify", "two_dc", "--quick", "--impairment", "none", "--allow-missing-netem", "--json",
                timeout=300)
    assert cleanup.leftovers() == {}
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    rates = [c for c in d["checks"] if c["kind"] == "link_rate"]
    assert {c["subject"] for c in rates} == {"east->west", "west->east"}
    assert all(c["status"] == "pass" and 0.97 <= c["extra"]["ratio"] <= 1.03 for c in rates), rates
    assert [c["status"] for c in d["checks"] if c["kind"] == "link_rtt"] == ["skipped"]
    assert "self-test: ok in" in r.stderr


def test_verify_json_without_netem():
    """`net verify` end to end on this machine: goodput checked, delays reported as skipped (not failed)."""
    require_root_tools("iperf3", "ping")
    assert not cleanup.owned_netns(), "a testbed network is already up"
    r = run_cli("net", "verify", "two_dc", "--impairment", "none", "--allow-missing-netem", "--json",
                "--seconds", "2", "--pings", "3", timeout=300)
    assert cleanup.leftovers() == {}
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(r.stdout)
    assert d["ok"] is True and d["impairment"]["backend"] == "none"
    kinds = {}
    for c in d["checks"]:
        kinds.setdefault(c["kind"], []).append(c)
    assert {c["subject"] for c in kinds["link_goodput"]} == {"east->west", "west->east"}
    assert all(c["status"] == "pass" and c["extra"]["ratio"] >= 0.9 for c in kinds["link_goodput"])
    # the spec's 20 ms each way could not be applied: reported, never passed off as measured
    assert all(c["status"] == "skipped" for c in kinds["link_rtt"] + kinds["pair_rtt"])
    assert kinds["pair_rtt"][0]["expected"] == pytest.approx(0.040)


def until_eof_ends_the_command_when_stdin_closes() -> None:
    """`net exec --until-eof NODE -- CMD` (how the launcher runs commands on other servers over ssh): CMD runs in
    the node, and ends when the exec's stdin closes (the ssh channel), its process group with it."""
    import subprocess
    import sys
    import time

    from tests.conftest import REPO, cli_env

    marker = "3141.5"  # a sleep no one else runs
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "net", "exec", "--until-eof", "east-h1", "--",
                          "sh", "-c", f"sleep {marker} & sleep {marker}; echo never"], cwd=REPO, env=cli_env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(_pids(f"^sleep {marker}$")) < 2:
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.1)
        ns = subprocess.run(["ip", "netns", "identify", _pids(f"^sleep {marker}$")[0]], capture_output=True,
                            text=True).stdout.strip()
        assert ns == "tb-east-h1", ns
        time.sleep(1.0)
        assert p.poll() is None  # stdin open: it runs on
        p.stdin.close()
        p.wait(timeout=15)
        out, err = p.stdout.read(), p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + 15 and "never" not in out, (p.returncode, out, err)
    assert _pids(f"^sleep {marker}$") == []  # the background sleep too: the whole group ended


def _pids(pattern: str) -> list[str]:
    import subprocess

    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def test_net_exec_on_a_gpu_host_sees_its_own_devices_only(tmp_path):
    """`net up` of a topology whose DC a asks gpus: 1 per host, on a machine listing three devices (a stand-in
    nvidia-smi first on the PATH: no GPU here); from another process, `net exec` gives each process host its
    own CUDA_VISIBLE_DEVICES (a-h1 0, a-h2 1), a host without gpus: none at all; then `net down`."""
    import subprocess
    import sys

    import yaml

    from tests.conftest import REPO, cli_env, fake_gpus

    require_root_tools()
    env = cli_env()
    env["PATH"] = f"{fake_gpus(tmp_path / 'bin', 3)}:{env['PATH']}"
    topo = tmp_path / "gpus.yaml"
    topo.write_text(yaml.safe_dump({"name": "gpus2", "dcs": [{"name": "a", "hosts": 2, "gpus": 1},
                                                             {"name": "b", "hosts": 1}],
                                    "links": [{"a": "a", "b": "b", "rate": "100Mbit"}]}))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=180)

    r = cli("net", "up", str(topo), "--impairment", "none")
    assert r.returncode == 0, r.stderr
    try:
        seen = {}
        for node in ("a-h1", "a-h2", "b-h1"):
            x = run_cli("net", "exec", node, "--", "sh", "-c", "echo devices=${CUDA_VISIBLE_DEVICES-unset}")
            assert x.returncode == 0, x.stderr
            seen[node] = x.stdout.strip()
    finally:
        d = cli("net", "down")
    assert d.returncode == 0, d.stderr
    assert seen == {"a-h1": "devices=0", "a-h2": "devices=1", "b-h1": "devices="}, seen
    assert not any(cleanup.leftovers().values()), cleanup.leftovers()
