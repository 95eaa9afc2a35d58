"""The fair clock: a start barrier for every process, one evaluation cadence, no dropped snapshots.

Real processes on loopback.  One worker (rank 3) is started late on purpose
(a wrapper around the interpreter sleeps before exec'ing it), so without the
barrier the other ASP workers would train for seconds before it exists.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from tests.training.helpers import spans

pytest.importorskip("torch")
from testbed.training.local import run_local  # noqa: E402

pytestmark = pytest.mark.torch

LATE_S = 8.0


def late_python(tmp_path: Path, job_glob: str) -> str:
    """An interpreter wrapper: the job whose path matches ``job_glob`` imports torch, sleeps LATE_S, then runs.

    (Sleeping before exec would not do: on two shared cores the others' torch
    imports take longer than the sleep, and the late process catches up.)
    """
    late = tmp_path / "late.py"
    late.write_text("import runpy, time\nimport torch  # noqa: F401\n"
                    f"time.sleep({LATE_S})\nrunpy.run_module('testbed.training.worker', run_name='__main__')\n")
    w = tmp_path / "late-python"
    w.write_text(f"#!/bin/sh\ncase \"$*\" in *{job_glob}*) shift 2; exec {sys.executable} {late} \"$@\";; esac\n"
                 f"exec {sys.executable} \"$@\"\n")
    w.chmod(w.stat().st_mode | stat.S_IXUSR)
    return str(w)


def first(rows, phase, **match):
    out = [s for s in rows if s["phase"] == phase and all(s.get(k) == v for k, v in match.items())]
    return min(out, key=lambda s: s["ts"]) if out else None


@pytest.mark.parametrize("scheme", [{"name": "asp"}, {"name": "gsyn", "groups": 2}])
def test_no_worker_steps_before_every_process_is_ready(tmp_path, scheme):
    cfg = {"workload": {"name": "digits", "batch_size": 8}, "scheme": scheme, "stop": {"steps": 6},
           "eval_every_samples": 64}
    res = run_local(cfg, {"a": 2, "b": 2}, tmp_path / "run", timeout_s=180,
                    python=late_python(tmp_path, "jobs/3.json"))
    assert res.ok, res.diagnosis()
    rows = spans(res.out_dir)
    barrier = [s for s in rows if s["phase"] == "wait" and s.get("what") == "start_barrier"]
    expected = 5  # four workers and the server
    assert len(barrier) == expected and {s["processes"] for s in barrier} == {expected}
    release = {s["start_ns"] for s in barrier}
    assert len(release) == 1, release  # one zero for every process
    (release_ns,) = release
    last_arrival = max(s["ts"] for s in barrier)
    assert release_ns >= last_arrival
    # The late worker really was late: it arrived seconds after the others (their own start-up
    # on two loaded cores takes ~5-10 s, so only a part of LATE_S shows).  Gsyn's workers wait for
    # each other anyway (subgroups are built by the whole world); only the server is early there.
    late = next(s for s in barrier if s["rank"] == 3)
    others = sorted(s["ts"] for s in barrier if s is not late)
    assert late["ts"] - others[0 if scheme["name"] == "gsyn" else len(others) // 2] > 2e9, (late["ts"], others)
    # No worker's first step began before every process had arrived.
    for r in range(4):
        c = first(rows, "compute", rank=r, role="worker")
        assert c is not None and c["ts"] >= last_arrival, (r, c["ts"], last_arrival)
    # The training clock starts at the release: the initial model is row 0 at wall_s 0, and no row
    # is timed before it; the late start-up is not on the clock (the run itself takes well under LATE_S).
    lines = (res.out_dir / "metrics.csv").read_text().splitlines()
    hdr = lines[0].split(",")
    metrics = [dict(zip(hdr, line.split(","))) for line in lines[1:]]
    assert float(metrics[0]["wall_s"]) == 0.0 and int(metrics[0]["samples"]) == 0
    assert all(float(m["wall_s"]) >= 0 for m in metrics)


def test_one_cadence_in_samples_for_every_scheme_and_none_dropped(tmp_path):
    """eval_every_samples = 64 with 4 workers x batch 8: BSP steps are 32 samples, ASP updates 8,
    Gsyn (2 groups of 2) updates 16; every scheme gets a row at each multiple of 64 samples."""
    got = {}
    for scheme in ({"name": "bsp"}, {"name": "asp"}, {"name": "gsyn", "groups": 2}):
        cfg = {"workload": {"name": "digits", "batch_size": 8}, "scheme": scheme, "stop": {"steps": 8},
               "eval_every_samples": 64, "eval_every": 1}
        res = run_local(cfg, {"a": 2, "b": 2}, tmp_path / scheme["name"], timeout_s=180)
        assert res.ok, res.diagnosis()
        lines = (res.out_dir / "metrics.csv").read_text().splitlines()
        hdr = lines[0].split(",")
        samples = [int(dict(zip(hdr, line.split(",")))["samples"]) for line in lines[1:]]
        got[scheme["name"]] = samples
    total = 8 * 4 * 8  # steps x workers x batch: every scheme processes the same samples here
    for name, samples in got.items():
        assert samples[0] == 0 and samples[-1] == total, (name, samples)
        marks = [s for s in samples[1:-1]]
        # one row per crossed multiple of 64 (the update that crossed it), none skipped
        assert [s // 64 for s in marks] == list(range(1, total // 64)) or \
            [s // 64 for s in samples[1:]] == list(range(1, total // 64 + 1)), (name, samples)
        assert all(s % 64 < {"bsp": 32, "asp": 8, "gsyn": 16}[name] for s in marks), (name, samples)


def test_evaluator_queues_every_snapshot(tmp_path):
    """A busy evaluator keeps every snapshot (the old one kept only the newest)."""
    import threading

    import torch

    from testbed.collect.recorder import Recorder
    from testbed.training.evaluator import SnapshotEvaluator

    gate = threading.Event()

    class Slow(SnapshotEvaluator):
        def _evaluate(self, key, step, updates, wall_s, samples, snap):
            gate.wait(10)
            self.writer.write(step, wall_s, float(snap[0]), None, updates, samples=samples)

    rec = Recorder(None, host="h", role="worker", rank=0)
    ev = Slow(rec, tmp_path / "metrics.csv", None, "test-eval")
    for i in range(20):
        ev._put(0, i, i, torch.tensor([float(i)]), wall_s=float(i), samples=i)
    gate.set()
    ev.close()
    assert [r["step"] for r in ev.writer.rows] == list(range(20)) and ev.dropped == 0
    assert os.path.getsize(tmp_path / "metrics.csv") > 0
