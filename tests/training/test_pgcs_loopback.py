"""PGCS and its baselines on loopback gloo: same result as sequential, overlap, no stale update.

Two workers in two DCs (``a1``, ``b1``) train the tiny ``experts`` workload
(E = 2 char-LM experts).  Processes are forked from a forkserver that has
imported torch once, so a run costs about a second instead of an
interpreter start per worker; each runs the real worker entry point
(``testbed.training.worker.main``) on a job file made by ``make_jobs``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.multiprocessing as mp  # noqa: E402

from testbed.training.config import validate_training  # noqa: E402
from testbed.training.jobs import make_jobs, write_jobs  # noqa: E402
from testbed.training.local import free_port, loopback_placement  # noqa: E402

pytestmark = pytest.mark.torch

E = 2
STEPS = 8
EXPERTS = {"name": "experts", "experts": E, "batch_size": 4, "seq_len": 16, "d_model": 16, "n_heads": 2,
           "n_layers": 1, "d_ff": 32, "train_chars": 20_000, "eval_chars": 2_048}
PRELOAD = ["torch", "torch.distributed", "testbed.training.worker", "testbed.training.runtime",
           "testbed.training.schemes.pgcs", "testbed.training.workloads.experts",
           "testbed.training.workloads.synthetic", "testbed.planning.executor"]


def _child(path: str, log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from testbed.training.worker import main

    sys.exit(main([path]))


def launch(cfg: Mapping[str, Any], out: Path, dcs: Mapping[str, int] | None = None, timeout_s: float = 60) -> Path:
    """Run one trial (workers only) with forked processes; fail the test with the logs on error."""
    data = validate_training(cfg).to_dict()
    data["rendezvous_port"] = free_port()
    data["server_port"] = free_port()
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    jobs = make_jobs(data, loopback_placement(dcs or {"a": 1, "b": 1}, with_server=False), out, time.time_ns())
    paths = write_jobs(jobs, out)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    procs = [ctx.Process(target=_child, args=(str(p), str(out / "logs" / f"{j.name}.log")), daemon=True)
             for j, p in zip(jobs, paths)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    failed = None
    while any(p.is_alive() for p in procs):
        bad = [p for p in procs if p.exitcode not in (None, 0)]
        if bad or time.monotonic() > deadline:
            failed = "timed out" if not bad else f"exit {bad[0].exitcode}"
            break
        time.sleep(0.05)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
    if failed is None and any(p.exitcode != 0 for p in procs):
        failed = f"exit codes {[p.exitcode for p in procs]}"
    if failed:
        logs = "\n".join(f"--- {f.name}\n{f.read_text()[-4000:]}" for f in sorted((out / "logs").glob("*.log")))
        pytest.fail(f"trial {failed}:\n{logs}")
    return out


def spans(out: Path, role: str, rank: int) -> list[dict[str, Any]]:
    (path,) = (out / "events").glob(f"*.{role}.{rank}.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model(out: Path, rank: int = 0) -> Any:
    return torch.load(out / "models" / f"worker.{rank}.pt")


def cfg(scheme: Mapping[str, Any] | str, workload: Mapping[str, Any] = EXPERTS, **kw: Any) -> dict[str, Any]:
    return {"workload": dict(workload), "scheme": scheme, "stop": {"steps": STEPS}, "eval_every": 2,
            "save_model": True, "comm_timeout_s": 30, "seed": 3, **kw}


def sync_spans(out: Path, role: str, rank: int) -> list[dict[str, Any]]:
    return [s for s in spans(out, role, rank) if s["phase"] in ("wan_sync", "intra_sync")]


def overlap_ns(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    total = 0
    for x in a:
        for y in b:
            total += max(0, min(x["ts"] + x["dur"], y["ts"] + y["dur"]) - max(x["ts"], y["ts"]))
    return total


def assert_no_stale_update(out: Path, rank: int, sync_role: str) -> None:
    """Every compute of expert k at step s >= E starts after step s-E's sync and update ended."""
    computes = [s for s in spans(out, "worker", rank) if s["phase"] == "compute"]
    syncs = sync_spans(out, sync_role, rank)
    applies = [s for s in spans(out, sync_role, rank) if s["phase"] == "apply"]
    assert len(computes) == STEPS and len(applies) == STEPS
    by_step = {s["step"]: s for s in computes}
    for s in computes:
        assert s["expert"] == s["step"] % E
    for c in computes:
        if c["step"] < E:
            continue
        prev = c["step"] - E
        done = [x for x in syncs + applies if x["step"] == prev]
        assert done and all(x["expert"] == c["expert"] for x in done)
        assert max(x["ts"] + x["dur"] for x in done) <= c["ts"], f"step {c['step']} computed on a stale expert"
        assert by_step[prev]["ts"] + by_step[prev]["dur"] <= min(x["ts"] for x in done)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    return launch(cfg({"name": "pgcs", "overlap": False}), tmp_path_factory.mktemp("sequential"))


def test_sequential_baseline_never_overlaps(sequential):
    for rank in (0, 1):
        assert not list((sequential / "events").glob(f"*.comm.{rank}.jsonl")), "sequential has no comm thread"
        computes = [s for s in spans(sequential, "worker", rank) if s["phase"] == "compute"]
        syncs = sync_spans(sequential, "worker", rank)
        assert len(computes) == STEPS and len(syncs) == STEPS
        assert all(s["phase"] == "wan_sync" and s["bytes"] > 0 and s["expert"] == s["step"] % E for s in syncs)
        assert overlap_ns(computes, syncs) == 0
        assert_no_stale_update(sequential, rank, "worker")
    torch.testing.assert_close(model(sequential, 0), model(sequential, 1), rtol=0, atol=0)


def test_pgcs_equals_sequential_and_overlaps(sequential, tmp_path):
    out = launch(cfg({"name": "pgcs"}), tmp_path)
    assert torch.equal(model(out, 0), model(sequential, 0)), "PGCS must give exactly the sequential result"
    assert torch.equal(model(out, 1), model(out, 0))
    for rank in (0, 1):
        computes = [s for s in spans(out, "worker", rank) if s["phase"] == "compute"]
        syncs = sync_spans(out, "comm", rank)
        assert len(syncs) == STEPS
        assert all(s["role"] == "comm" and s["phase"] == "wan_sync" and s["bytes"] > 0 for s in syncs)
        assert {s["expert"] for s in syncs} == set(range(E))
        assert overlap_ns(computes, syncs) > 0, "the comm thread's syncs never overlapped compute"
        assert_no_stale_update(out, rank, "comm")
        assert not sync_spans(out, "worker", rank), "with overlap the main thread does not sync"
        assert all(w["dur"] >= 0 and w.get("what") in ("expert_sync", "drain", "rendezvous", "start_barrier")
                   for w in spans(out, "worker", rank) if w["phase"] == "wait")
    rows = (out / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,wall_s,loss,acc,expert,updates,samples"
    parsed = [dict(zip(rows[0].split(","), r.split(","))) for r in rows[1:]]
    for k in range(E):
        mine = [r for r in parsed if r["expert"] == str(k)]
        ups = [int(r["updates"]) for r in mine]  # initial, every 2 updates (none skipped), final
        assert ups == [0, 2, 4][: len(ups)] and ups[-1] == STEPS // E, mine
        assert float(mine[-1]["loss"]) < float(mine[0]["loss"])


def test_blp_sync_matches_sequential(sequential, tmp_path):
    import networkx as nx

    from testbed.planning.solver import plan_blp

    g = nx.DiGraph()
    g.add_edge("a", "b", rate_bps=1e8, delay_s=0.01)
    g.add_edge("b", "a", rate_bps=1e8, delay_s=0.01)
    plan = plan_blp(g, 40_000, chunks=3).to_dict()
    out = launch(cfg({"name": "pgcs", "sync": "blp", "plan": plan}), tmp_path)
    torch.testing.assert_close(model(out, 0), model(sequential, 0), rtol=1e-5, atol=1e-6)
    syncs = sync_spans(out, "comm", 0)
    assert len(syncs) == STEPS and all(s["op"] == "blp" and s["bytes"] > 0 for s in syncs)
    assert_no_stale_update(out, 0, "comm")


def test_ddp_overlap_matches_sequential(sequential, tmp_path):
    out = launch(cfg({"name": "ddp_overlap", "buckets": 3}), tmp_path)
    torch.testing.assert_close(model(out, 0), model(sequential, 0), rtol=1e-5, atol=1e-6)
    syncs = sync_spans(out, "comm", 1)
    per_step: dict[int, list[dict[str, Any]]] = {}
    for s in syncs:
        per_step.setdefault(s["step"], []).append(s)
    assert sorted(per_step) == list(range(STEPS))
    assert all(len(v) >= 2 and [s["bucket"] for s in v] == list(range(len(v))) for v in per_step.values())
    computes = {s["step"]: s for s in spans(out, "worker", 1) if s["phase"] == "compute"}
    applies = {s["step"]: s for s in spans(out, "worker", 1) if s["phase"] == "apply"}
    for step, v in per_step.items():  # buckets run inside the step: after its compute began, before its update
        assert min(s["ts"] for s in v) >= computes[step]["ts"]
        assert max(s["ts"] + s["dur"] for s in v) <= applies[step]["ts"]


def test_ddp_overlap_syncs_buckets_while_backward_runs(tmp_path):
    """A set compute time is spent as a real step spends it: a third before backward, the rest through
    backward, so the first buckets' syncs start well before the step's compute ends (real DDP's
    overlap); the step still takes the set time.  Before, the whole pad came before backward and every
    bucket started after the compute ended: ddp_overlap measured the same as sequential."""
    compute_s = 0.3
    syn = {"name": "synthetic", "params": 40_000, "layers": 8, "compute_s": compute_s}
    out = launch(cfg({"name": "ddp_overlap", "buckets": 4}, syn, stop={"steps": 4}), tmp_path)
    for rank in (0, 1):
        computes = {s["step"]: s for s in spans(out, "worker", rank) if s["phase"] == "compute"}
        syncs: dict[int, list[dict[str, Any]]] = {}
        for s in sync_spans(out, "comm", rank):
            syncs.setdefault(s["step"], []).append(s)
        assert sorted(computes) == sorted(syncs) == [0, 1, 2, 3]
        for step, c in computes.items():
            end = c["ts"] + c["dur"]
            assert c["dur"] >= compute_s * 1e9 - 1e5, c  # the set time, all of it (a floor, also under load)
            assert len(syncs[step]) == 4
            first = min(s["ts"] for s in syncs[step])
            # the first bucket (the last two layers) is ready a third + a quarter of two thirds in:
            # 0.15 s before the end; allow half of that for a loaded machine
            assert end - first >= 0.5 * 0.5 * compute_s * 1e9, (step, (end - first) / 1e9)
            # the last bucket (the first layer's) is ready when the set time is over, not before: a
            # backward faster than the last step's does not hand the sync a head start
            last = max(s["ts"] for s in syncs[step])
            assert last >= c["ts"] + compute_s * 1e9 - 1e5, (step, (c["ts"] + compute_s * 1e9 - last) / 1e6)


def test_hierarchical_synthetic_experts_stop_together_on_wall_clock(tmp_path):
    syn = {"name": "synthetic", "params": 20_000, "compute_s": 0.01}
    c = cfg({"name": "pgcs", "experts": 3, "sync": "hierarchical"}, syn, stop={"steps": 100_000, "wall_s": 3.0})
    out = launch(c, tmp_path, dcs={"a": 2, "b": 1})
    steps = [len([s for s in spans(out, "worker", r) if s["phase"] == "compute"]) for r in range(3)]
    assert steps[0] == steps[1] == steps[2] >= 3, steps
    assert torch.equal(model(out, 0), model(out, 1)) and torch.equal(model(out, 0), model(out, 2))
    assert model(out, 0).numel() == 3 * 20_000
    leader = sync_spans(out, "comm", 0)
    assert {s["phase"] for s in leader} == {"intra_sync", "wan_sync"}
    assert {s["phase"] for s in sync_spans(out, "comm", 1)} == {"intra_sync"}


def test_ddp_buckets_cover_the_gradient_backwards():
    from testbed.training.flat import FlatModel
    from testbed.training.overlap import make_buckets
    from testbed.training.workloads import build_workload
    from testbed.training.workloads.experts_params import ExpertsParams

    params = ExpertsParams(**{k: v for k, v in EXPERTS.items() if k != "name"})
    flat = FlatModel(build_workload("experts", params, 0).expert_workloads()[0].build_model(), "cpu", extra=1)
    offs = [0]
    for p in flat.plist:
        offs.append(offs[-1] + p.numel())
    for want in (1, 2, 3, 4, 8, 100):
        bs = make_buckets(flat, want)
        assert bs[0][1] == flat.n and bs[-1][0] == 0
        assert all(bs[i][0] == bs[i + 1][1] for i in range(len(bs) - 1))
        assert [i for _, _, m in bs for i in m] == list(reversed(range(len(flat.plist))))
        for lo, hi, members in bs:
            assert lo == offs[min(members)] and hi == offs[max(members) + 1]
        assert len(bs) <= max(want, 1) + 1


def test_samples_cadence_evaluates_every_expert_at_each_crossing(tmp_path):
    """With ``eval_every_samples`` the whole model is evaluated (every expert), as in every other scheme.

    2 workers x batch 4 = 8 samples per step; every 16 samples = every 2 steps, each crossing
    writes one row per expert, all with the same ``samples`` and each expert's own update count.
    """
    out = launch(cfg({"name": "pgcs"}, eval_every_samples=16), tmp_path)
    rows = (out / "metrics.csv").read_text().splitlines()
    parsed = [dict(zip(rows[0].split(","), r.split(","))) for r in rows[1:]]
    by_samples: dict[str, list[dict[str, str]]] = {}
    for r in parsed:
        if r["samples"] not in ("", "0"):
            by_samples.setdefault(r["samples"], []).append(r)
    crossings = [s for s in by_samples if int(s) % 16 == 0]
    assert len(crossings) >= STEPS // 2 - 1, by_samples.keys()
    for s in crossings:
        assert sorted(int(r["expert"]) for r in by_samples[s]) == list(range(E)), (s, by_samples[s])
        # expert k after step t has (t + 1 - k + E - 1) // E updates: both experts' counts are current
        step = int(by_samples[s][0]["step"])
        assert {int(r["expert"]): int(r["updates"]) for r in by_samples[s]} == \
            {k: (step - k + E - 1) // E for k in range(E)}
