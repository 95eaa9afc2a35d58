"""Container hosts across servers (``runtime: docker``), emulate mode and shape mode: ``testbed run SPEC
--cluster FILE``, ``net up --cluster`` and ``net exec --container``.

The stand-in runs its own Docker daemon (its socket, data root and containerd its own, started over ssh as a
server's admin would), which starts with no image at all: the launcher must send its image there before the
part is built, and every container on either server must run that same image.  The trainers on the stand-in
start inside their containers over ssh only (``net exec --until-eof --container``).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from testbed.network import docker_hosts
from testbed.network.cleanup import leftovers
from tests.cluster.standins import (
    LINE,
    PLACEMENT,
    REPO,
    SUBNET,
    kill_cli_when,
    local_namespaces,
    on_s2,
    run_trials,
    running,
    s2_state,
    write,
)
from tests.conftest import run_cli
from tests.docker.conftest import build_trainer_image, require_docker

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.torch]

# a-h1 on the launcher; b-h1, c-h1 and the parameter server (in b) on the stand-in: containers, all of them
TOPO = dict(LINE, name="line3dk", ps="b", defaults={**LINE["defaults"], "runtime": "docker", "cpu": 0.6})
SPEC = {"name": "spread-docker", "topology": TOPO, "impairment": "auto", "timeout": "300s",
        "training": {"workload": {"name": "digits"}, "stop": {"steps": 15}, "eval_every": 5},
        "schemes": [{"label": "bsp", "scheme": {"name": "bsp"}}, {"label": "gsyn", "scheme": {"name": "gsyn"}}],
        "collectors": {"rate_hz": 10}}


@pytest.fixture(scope="module")
def image() -> str:
    require_docker()
    return build_trainer_image()


@pytest.fixture(scope="module")
def standins(tmp_path_factory, image):
    yield from running(tmp_path_factory.mktemp("docker"), 1, docker=True)


def test_bsp_and_gsyn_in_containers_across_two_servers(standins, image, tmp_path):
    before = on_s2(standins, "docker images --quiet")
    assert before.returncode == 0 and before.stdout.strip() == "", before  # the stand-in starts with no image
    ours = docker_hosts.image_id(image)
    spec = write(tmp_path, SPEC, "spread.yaml")
    cluster = write(tmp_path, standins.cluster(placement=PLACEMENT))
    r = run_cli("run", str(spec), "--cluster", str(cluster), "--results", str(tmp_path / "results"), "--json",
                timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    trials = [Path(t["dir"]) for t in json.loads(r.stdout)["trials"]]
    assert len(trials) == 2
    sent = []
    for trial in trials:
        m = json.loads((trial / "manifest.json").read_text())
        assert m["status"] == "ok", m["reason"]
        # the image went to the stand-in once (the first trial), and both servers ran the launcher's
        entry = m["cluster"]["images"]["s2"][image]
        assert entry["id"] == ours, entry
        sent.append(entry["sent"])
        runtimes = m["runtimes"]
        assert set(runtimes) >= {"a-h1", "b-h1", "c-h1", "b-ps"}, runtimes
        for node, rt in runtimes.items():
            assert rt["image_id"] == ours and rt["torch"] == "2.13.0+cpu", (node, rt)
            assert rt.get("server", "s1") == ("s1" if node.startswith("a-") else "s2"), (node, rt)
        # every process's records are here; each trainer ran the image's Python (its own record says so)
        names = {p["name"] for p in m["processes"]}
        assert {n.split(".")[0] for n in names} >= {"a-h1", "b-h1", "c-h1"}
        assert all(p["returncode"] == 0 for p in m["processes"]), m["processes"]
        for n in names:
            assert (trial / "events" / f"{n}.jsonl").stat().st_size > 0, n
            rec = json.loads((trial / "procs" / f"{n}.json").read_text())
            assert rec["executable"] == "/usr/bin/python3", (n, rec)  # the image's, not a venv's
        steps = {f.stem: sum(1 for ln in f.read_text().splitlines() if '"compute"' in ln)
                 for f in (trial / "events").glob("*.jsonl")}
        assert all(v >= 15 for k, v in steps.items() if "-h" in k), steps
        # the stand-in's sampler found its trainers inside their containers
        stats = m["cluster"]["remote_sampler_stats"]["s2"]
        assert stats["trainers_found"] >= 2, stats
        print(f"MEASURED {m['label']}: image sent={entry['sent']} ({entry.get('bytes', 0) / 1e6:.0f} MB in "
              f"{entry.get('s', 0)} s); network up {m['network']['up_s']:.1f} s; steps {steps}; s2 sampler {stats}")
    assert sent == [True, False], sent
    # nothing is left on either server: no container, namespace or record directory
    assert on_s2(standins, "docker ps --all --quiet").stdout.strip() == ""
    assert s2_state(standins) == {}
    assert local_namespaces() == [] and leftovers() == {}


def test_a_launcher_without_the_image_is_refused_before_anything_is_built(standins, tmp_path):
    topo = dict(TOPO, defaults={**TOPO["defaults"], "image": "geo-testbed/no-such-image:1"})
    spec = write(tmp_path, dict(SPEC, topology=topo, schemes=SPEC["schemes"][:1]), "spread.yaml")
    cluster = write(tmp_path, standins.cluster(placement=PLACEMENT))
    r = run_cli("run", str(spec), "--cluster", str(cluster), "--results", str(tmp_path / "results"), timeout=300)
    assert r.returncode == 2, r.stdout[-1000:] + r.stderr[-2000:]
    assert "no-such-image" in r.stderr, r.stderr[-1000:]
    print("MEASURED refused:", r.stderr.strip().splitlines()[-1])
    assert on_s2(standins, "docker ps --all --quiet").stdout.strip() == ""
    assert s2_state(standins) == {} and local_namespaces() == [] and leftovers() == {}


@pytest.mark.parametrize("mode", ["emulate", "shape"])
def test_containers_left_by_a_killed_launcher_are_removed_by_one_clean(standins, image, tmp_path, mode):
    """SIGKILL of `testbed run --cluster` while its trainers train in containers on both servers; one
    `testbed clean --cluster` then removes every container, namespace, shaper and scratch directory, on both."""
    spec = dict(SPEC, schemes=SPEC["schemes"][:1], topology=TOPO if mode == "emulate" else SHAPED,
                training=dict(SPEC["training"], stop={"steps": 100000, "wall_s": 120}))
    cluster = write(tmp_path, standins.cluster(placement=PLACEMENT) if mode == "emulate"
                    else standins.cluster(mode="shape"))
    # killed once training runs in containers on the stand-in: its trainers' processes (argv names a job file)
    kill_cli_when(standins, ["run", str(write(tmp_path, spec, "long.yaml")), "--cluster", str(cluster),
                             "--results", str(tmp_path / "results")],
                  "ps ax -o args | grep '[p]ython3 .*jobs/'", "worker", "the stand-in's trainers never started",
                  every_s=0.5)
    mine, theirs = ((["tb-a-h1"], ["tb-b-h1", "tb-b-ps", "tb-c-h1"]) if mode == "emulate"
                    else (["tb-a-h1", "tb-a-h2"], ["tb-c-h1", "tb-c-ps"]))
    assert docker_hosts.owned() == mine, docker_hosts.owned()  # the launcher's own, left too
    left = on_s2(standins, "docker ps --all --format '{{.Names}}'").stdout.split()
    assert sorted(left) == theirs, left  # what the crash left there
    r = run_cli("clean", "--cluster", str(cluster), timeout=180)
    assert r.returncode == 0, r.stderr
    assert on_s2(standins, "docker ps --all --quiet").stdout.strip() == ""
    assert "python3" not in on_s2(standins, "ps ax -o args | grep '[j]obs/'").stdout
    assert s2_state(standins) == {} and local_namespaces() == [] and leftovers() == {}
    print(f"MEASURED killed launcher ({mode}): {len(left)} containers left on s2, removed by one clean --cluster")


# shape mode: a (two hosts) on the launcher, c (one host and the parameter server) on the stand-in, b relays;
# every host a container sharing its server's network (shape_hosts), so its traffic must take the shaper
SHAPED = {"name": "relay3dk", "ps": "c", "defaults": {"runtime": "docker", "cpu": 0.6},
          "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 0}, {"name": "c", "hosts": 1}],
          "links": [{"a": "a", "b": "b", "rate": "40Mbit", "delay": "5ms"},
                    {"a": "b", "b": "c", "rate": "30Mbit", "delay": "3ms"}]}
SHAPED_RTT_MS = 16.0

#: run inside a container: the interpreter, PID 1's command, and the least time of 10 TCP connects to each
#: address:port given (a closed port answers at once with a reset: one round trip, no listener needed)
CONNECT_PROBE = """
import json, socket, sys, time
out = {"executable": sys.executable, "pid1": open("/proc/1/cmdline").read().replace("\\0", " ").strip()}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    best = None
    for _ in range(10):
        t = time.perf_counter()
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except ConnectionRefusedError:
            pass
        best = min(best or 1e9, (time.perf_counter() - t) * 1e3)
        time.sleep(0.03)
    out[target] = best
print(json.dumps(out))
"""


def test_net_up_in_shape_mode_puts_container_hosts_behind_their_servers_shapers(standins, image, tmp_path):
    """`net up --cluster` (shape), then from other processes: each server's container hosts reach the other DC
    only through that server's shaper (a round trip of the path's RTT, measured inside the container, on the
    launcher and over ssh on the stand-in), while ssh between the servers is not delayed; `net down` leaves
    no container on either server."""
    topo = str(write(tmp_path, SHAPED, "topo.yaml"))
    cluster = str(write(tmp_path, standins.cluster(mode="shape")))
    s1, s2 = f"{SUBNET}.1", standins.servers[0].address
    up = run_cli("net", "up", topo, "--cluster", cluster, timeout=600)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert sorted(docker_hosts.owned()) == ["tb-a-h1", "tb-a-h2"], docker_hosts.owned()
        left = on_s2(standins, "docker ps --format '{{.Names}}'").stdout.split()
        assert sorted(left) == ["tb-c-h1", "tb-c-ps"], left
        here = run_cli("net", "exec", "--container", "a-h1", "--", "python3", "-c", CONNECT_PROBE,
                       f"{s2}:9", f"{s2}:22", timeout=120)
        assert here.returncode == 0, here.stderr
        a = json.loads(here.stdout.strip().splitlines()[-1])
        there = on_s2(standins, f"cd {shlex.quote(str(REPO))} && {shlex.quote(sys.executable)} -m testbed.cli net "
                                f"exec --container c-h1 -- python3 -c {shlex.quote(CONNECT_PROBE)} {s1}:9",
                      timeout=120)
        assert there.returncode == 0, there.stderr
        c = json.loads(there.stdout.strip().splitlines()[-1])
        print(f"MEASURED shape, in containers: a-h1 -> s2 {a[f'{s2}:9']:.2f} ms, c-h1 -> s1 {c[f'{s1}:9']:.2f} ms "
              f"(spec {SHAPED_RTT_MS:g}); a-h1 -> s2's ssh {a[f'{s2}:22']:.2f} ms (not shaped)")
        for probe in (a, c):  # the image's interpreter, in the container's own PID namespace
            assert probe["executable"] == "/usr/bin/python3" and probe["pid1"].startswith("sleep"), probe
        assert SHAPED_RTT_MS <= a[f"{s2}:9"] <= SHAPED_RTT_MS + 3, a
        assert SHAPED_RTT_MS <= c[f"{s1}:9"] <= SHAPED_RTT_MS + 3, c
        assert a[f"{s2}:22"] < 5, a  # the testbed's control traffic takes no shaper
        sh = run_cli("net", "show", timeout=60)
        assert "container hosts (host network): a-h1, a-h2" in sh.stdout, sh.stdout
        bad = run_cli("net", "exec", "--container", "s1", "--", "true", timeout=60)
        assert bad.returncode == 2 and "not a container host" in bad.stderr, bad.stderr
    finally:
        down = run_cli("net", "down", "--cluster", cluster, timeout=300)
    assert down.returncode == 0, down.stderr[-2000:]
    assert docker_hosts.owned() == [] and on_s2(standins, "docker ps --all --quiet").stdout.strip() == ""
    assert s2_state(standins) == {} and local_namespaces() == [] and leftovers() == {}


def test_bsp_and_gsyn_in_shape_mode_train_in_containers_through_the_shapers(standins, image, tmp_path):
    ours = docker_hosts.image_id(image)
    spec = write(tmp_path, dict(SPEC, name="shaped-docker", topology=SHAPED), "shaped.yaml")
    cluster = write(tmp_path, standins.cluster(mode="shape"))
    for trial, m in run_trials(spec, cluster, tmp_path / "results", 2, timeout=1200):
        assert m["cluster"]["mode"] == "shape" and m["cluster"]["images"]["s2"][image]["id"] == ours
        runtimes = m["runtimes"]
        want = {"a-h1", "a-h2", "c-h1", "c-ps"}
        assert set(runtimes) == want, runtimes
        for node, rt in runtimes.items():
            assert rt["image_id"] == ours and rt["torch"] == "2.13.0+cpu", (node, rt)
            assert rt["server"] == ("s1" if node.startswith("a-") else "s2"), (node, rt)
        names = {p["name"] for p in m["processes"]}
        assert {n.split(".")[0] for n in names} == {"a-h1", "a-h2", "c-h1"} | ({"c-ps"} if m["label"] == "gsyn"
                                                                              else set()), names
        assert all(p["returncode"] == 0 for p in m["processes"]), m["processes"]
        for n in names:  # every record here; every trainer ran the image's Python
            assert (trial / "events" / f"{n}.jsonl").stat().st_size > 0, n
            assert json.loads((trial / "procs" / f"{n}.json").read_text())["executable"] == "/usr/bin/python3", n
        # the trainers' own connections between the servers saw the path's round trip: through the shapers
        tcp = [json.loads(ln) for ln in (trial / "samples" / "tcp.jsonl").read_text().splitlines()]
        across = [x["rtt_us"] / 1e3 for x in tcp if x.get("rtt_us")
                  and x["src"].rsplit(":", 1)[0] != x["dst"].rsplit(":", 1)[0]]
        assert across and min(across) >= 0.9 * SHAPED_RTT_MS, sorted(across)[:5]
        links = [json.loads(ln) for ln in (trial / "samples" / "links.jsonl").read_text().splitlines()]
        for link in ("a->c", "c->a"):
            tx = [x["tx_bytes"] for x in links if x.get("link") == link]
            assert tx and tx[-1] - tx[0] > 100_000, (link, tx[:3])
        stats = m["cluster"]["remote_sampler_stats"]["s2"]
        assert stats["trainers_found"] >= 1, stats
        print(f"MEASURED shape {m['label']} in containers: network up {m['network']['up_s']:.1f} s; trainer "
              f"connections across servers: {len(across)} TCP rows, smoothed RTT >= {min(across):.1f} ms "
              f"(spec {SHAPED_RTT_MS:g}); s2 sampler {stats}")
    assert docker_hosts.owned() == [] and on_s2(standins, "docker ps --all --quiet").stdout.strip() == ""
    assert s2_state(standins) == {} and local_namespaces() == [] and leftovers() == {}
