"""One real training experiment (two DCs, BSP and Gsyn) on runtime: docker hosts, against the same spec on
process hosts: the trainers ran the image's own Python and torch inside the containers, their traffic crossed
the shaped WAN (interface counters vs span bytes), and the records have the same shape."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from testbed.experiments.runner import run_experiment
from testbed.experiments.spec import parse_experiment
from testbed.network import docker_hosts
from testbed.network.cleanup import leftovers
from tests.docker.conftest import build_trainer_image
from tests.experiments.test_real_runs import _link_tx, _span_wan

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow]


def spec(runtime: str) -> dict:
    topo = {"name": f"acct-{runtime}", "defaults": {"hosts": 1, "runtime": runtime},
            "dcs": ["a", "b"], "links": [{"a": "a", "b": "b", "rate": "50Mbit", "delay": "5ms"}], "ps": "a"}
    return {"name": f"real-{runtime}", "topology": topo, "impairment": "userspace", "timeout": "180s",
            "training": {"workload": {"name": "digits"}, "stop": {"steps": 15}, "eval_every": 5},
            "schemes": [{"label": "bsp", "scheme": {"name": "bsp"}}, {"label": "gsyn", "scheme": {"name": "gsyn"}}],
            "collectors": {"rate_hz": 20}}


@pytest.fixture(scope="module")
def trainer_image() -> str:
    return build_trainer_image()


def shape_of(trial: Path) -> dict:
    """What a trial's records hold, without their values: files, metric columns, span phases per process."""
    files = sorted(str(p.relative_to(trial)) for p in trial.rglob("*") if p.is_file() and "logs" not in p.parts)
    phases = {f.name: sorted({json.loads(x)["phase"] for x in f.read_text().splitlines()})
              for f in (trial / "events").glob("*.jsonl")}
    header = (trial / "metrics.csv").read_text().splitlines()[0]
    return {"files": files, "phases": phases, "metrics": header}


def test_training_on_docker_hosts_matches_process_hosts(tmp_path, trainer_image):
    runs = {}
    for runtime in ("docker", "process"):
        res = run_experiment(parse_experiment(spec(runtime)), run_dir=tmp_path / runtime)
        assert not res.failed, [(t.label, t.reason) for t in res.failed]
        runs[runtime] = {t.label: t.dir for t in res.trials}
        assert leftovers() == {}
    venv = Path(sys.prefix).resolve()
    for label in ("bsp", "gsyn"):
        dk, pr = runs["docker"][label], runs["process"][label]
        m = json.loads((dk / "manifest.json").read_text())
        assert m["status"] == "ok"
        # every process ran in its container, on the image's interpreter and torch (not the venv's)
        assert set(m["runtimes"]) == {"a-h1", "b-h1", "a-ps"}
        for p in m["processes"]:
            rt = p["runtime"]
            assert rt["mnt_ns"] == m["runtimes"][p["host"]]["mnt_ns"], (label, p)
            assert rt["executable"] == "/usr/bin/python3" and rt["device"]["type"] == "cpu", (label, p)
            assert not rt["torch_path"].startswith(str(venv)), (label, p)
            # entered from the host, it gave up every capability before anything else (training.privileges)
            caps = rt["capabilities"]
            assert {caps[k] for k in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb")} == {"0" * 16}, (label, p)
            assert caps["NoNewPrivs"] == "1", (label, p)
        image_ids = {r["image_id"] for r in m["runtimes"].values()}
        assert image_ids == {docker_hosts.image_id(trainer_image)}
        mp = json.loads((pr / "manifest.json").read_text())
        # (namespace inode numbers are reused once a namespace is gone: only compared within a trial)
        assert "runtimes" not in mp
        assert all(p["runtime"]["torch_path"].startswith(str(venv)) for p in mp["processes"])
        assert not any("capabilities" in p["runtime"] for p in mp["processes"])  # process hosts keep theirs
        # their traffic crossed the shaped WAN: what the schemes say they sent is on the WAN interfaces
        links, spans = _link_tx(dk), _span_wan(dk)
        assert spans > 0 and spans <= links <= spans * 1.25 + 300_000, (label, links, spans)
        # the records have the same shape as on process hosts
        assert shape_of(dk) == shape_of(pr), label
    assert os.geteuid() == 0
