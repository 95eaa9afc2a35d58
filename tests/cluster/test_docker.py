"""Container hosts across servers (``runtime: docker``, emulate mode): ``testbed run SPEC --cluster FILE``.

The stand-in runs its own Docker daemon (its socket, data root and containerd its own, started over ssh as a
server's admin would), which starts with no image at all: the launcher must send its image there before the
part is built, and every container on either server must run that same image.  The trainers on the stand-in
start inside their containers over ssh only (``net exec --until-eof --container``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.network import docker_hosts
from testbed.network.cleanup import leftovers
from tests.cluster.standins import (
    LINE,
    PLACEMENT,
    kill_cli_when,
    local_namespaces,
    on_s2,
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


def test_containers_left_by_a_killed_launcher_are_removed_by_one_clean(standins, image, tmp_path):
    """SIGKILL of `testbed run --cluster` while its trainers train in containers on both servers; one
    `testbed clean --cluster` then removes every container, namespace and scratch directory, on both."""
    spec = dict(SPEC, schemes=SPEC["schemes"][:1],
                training=dict(SPEC["training"], stop={"steps": 100000, "wall_s": 120}))
    cluster = write(tmp_path, standins.cluster(placement=PLACEMENT))
    # killed once training runs in containers on the stand-in: its trainers' processes (argv names a job file)
    kill_cli_when(standins, ["run", str(write(tmp_path, spec, "long.yaml")), "--cluster", str(cluster),
                             "--results", str(tmp_path / "results")],
                  "ps ax -o args | grep '[p]ython3 .*jobs/'", "worker", "the stand-in's trainers never started",
                  every_s=0.5)
    assert docker_hosts.owned() == ["tb-a-h1"], docker_hosts.owned()  # the launcher's own, left too
    left = on_s2(standins, "docker ps --all --format '{{.Names}}'").stdout.split()
    assert sorted(left) == ["tb-b-h1", "tb-b-ps", "tb-c-h1"], left  # what the crash left there
    r = run_cli("clean", "--cluster", str(cluster), timeout=180)
    assert r.returncode == 0, r.stderr
    assert on_s2(standins, "docker ps --all --quiet").stdout.strip() == ""
    assert "python3" not in on_s2(standins, "ps ax -o args | grep '[j]obs/'").stdout
    assert s2_state(standins) == {} and local_namespaces() == [] and leftovers() == {}
    print(f"MEASURED killed launcher: {len(left)} containers left on s2, removed by one clean --cluster")
