"""Schemes on loopback (4 workers in DCs a and b, plus a server for PS schemes).

Deterministic workload (digits, fixed seeds) so every check is exact up to
float tolerance.  Each run takes a few seconds of work; the machine's load
decides the rest.
"""

from __future__ import annotations

import collections

import pytest

from tests.training.helpers import load_params, reference_params, replay_server, spans

torch = pytest.importorskip("torch")
from testbed.training.local import run_local  # noqa: E402

pytestmark = pytest.mark.torch

WORKERS = 4
DCS = {"a": 2, "b": 2}


def cfg(scheme, steps, **extra):
    return {"workload": {"name": "digits", "batch_size": 8}, "scheme": scheme, "stop": {"steps": steps},
            "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}, "eval_every": 1000, "save_model": True,
            **extra}


def run(tmp_path_factory, name, config):
    out = tmp_path_factory.mktemp(name)
    res = run_local(config, DCS, out, timeout_s=150)
    assert res.ok, res.diagnosis()
    return res


def applies_of(out):
    return [s for s in spans(out, "server") if s["phase"] == "apply"]


def assert_exactly_once(out, clients):
    """Every push the workers recorded was applied once, versions 1..V without gaps."""
    applies = applies_of(out)
    pushes = [s for s in spans(out, "worker") if s["phase"] == "push"]
    keys = collections.Counter((a["client"], a["step"]) for a in applies if not a.get("dup"))
    assert all(v == 1 for v in keys.values()), keys
    pushed = {(p.get("group", p["rank"]), p["step"]) for p in pushes}
    assert set(keys) == pushed
    versions = sorted(a["applied_version"] for a in applies if not a.get("dup"))
    assert versions == list(range(1, len(versions) + 1))
    assert {c for c, _ in keys} == set(clients)
    for a in applies:
        assert a["staleness"] == a["applied_version"] - 1 - a["version"]
    return applies


# -- BSP ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("allreduce", ["ring", "hierarchical"])
def test_bsp_equals_one_process_on_the_concatenated_batch(tmp_path_factory, allreduce):
    steps = 6
    config = cfg({"name": "bsp", "allreduce": allreduce}, steps)
    res = run(tmp_path_factory, f"bsp-{allreduce}", config)
    finals = [load_params(res.out_dir, "worker", r) for r in range(WORKERS)]
    for f in finals[1:]:
        assert torch.equal(f, finals[0])  # replicas bit-identical
    ref = reference_params(config, WORKERS, steps)
    assert torch.allclose(finals[0], ref, rtol=1e-5, atol=1e-6), (finals[0] - ref).abs().max()
    worker_spans = spans(res.out_dir, "worker")
    assert max(s["step"] for s in worker_spans if s["phase"] == "apply") == steps - 1
    sync = [s for s in worker_spans if s["phase"] in ("intra_sync", "wan_sync")]
    assert sync and all("bytes" in s for s in sync)
    if allreduce == "hierarchical":  # only DC leaders cross the WAN
        assert {s["host"] for s in sync if s["phase"] == "wan_sync"} == {"a1", "b1"}
    rows = (res.out_dir / "metrics.csv").read_text().splitlines()
    assert rows[0] == "step,wall_s,loss,acc,expert,updates,samples"
    last = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert int(last["updates"]) == steps and int(last["samples"]) == steps * 4 * 8, last


# -- Gsyn G=1 is BSP through the server --------------------------------------------------------------
def test_gsyn_one_group_matches_bsp(tmp_path_factory):
    steps = 6
    config = cfg({"name": "gsyn", "groups": 1}, steps)
    res = run(tmp_path_factory, "gsyn-g1", config)
    server = load_params(res.out_dir, "server", WORKERS)
    ref = reference_params(config, WORKERS, steps)
    assert torch.allclose(server, ref, rtol=1e-5, atol=1e-6), (server - ref).abs().max()
    applies = assert_exactly_once(res.out_dir, [0])
    assert [a["staleness"] for a in applies] == [0] * steps
    for r in range(WORKERS):  # every member ends with the server's model
        assert torch.equal(load_params(res.out_dir, "worker", r), server)


# -- ASP and Gsyn G=N: same update semantics ---------------------------------------------------------
@pytest.mark.parametrize("scheme", [{"name": "asp"}, {"name": "gsyn", "groups": WORKERS}])
def test_asp_and_gsyn_singletons_follow_asp_semantics(tmp_path_factory, scheme):
    steps = 8
    config = cfg(scheme, steps, slowdown=[{"hosts": ["b2"], "delay": {"dist": "constant", "value_s": 0.02}}])
    res = run(tmp_path_factory, f"{scheme['name']}-gn", config)
    if scheme["name"] == "gsyn":
        assert res.jobs[0].groups == [[r] for r in range(WORKERS)]
    applies = assert_exactly_once(res.out_dir, range(WORKERS))
    assert len(applies) == WORKERS * steps
    server = load_params(res.out_dir, "server", WORKERS)
    replayed = replay_server(config, applies, [[r] for r in range(WORKERS)], WORKERS)
    assert torch.allclose(server, replayed, rtol=1e-5, atol=1e-6), (server - replayed).abs().max()


def test_gsyn_two_groups_replay_and_staleness(tmp_path_factory):
    steps = 8
    config = cfg({"name": "gsyn"}, steps, slowdown=[{"dcs": ["b"], "delay": {"dist": "constant", "value_s": 0.02}}])
    res = run(tmp_path_factory, "gsyn-g2", config)
    groups = res.jobs[0].groups
    assert groups == [[0, 1], [2, 3]]
    applies = assert_exactly_once(res.out_dir, [0, 1])
    assert {a["group"] for a in applies} == {0, 1}
    server = load_params(res.out_dir, "server", WORKERS)
    replayed = replay_server(config, applies, groups, WORKERS)
    assert torch.allclose(server, replayed, rtol=1e-5, atol=1e-6)
    # members of a group hold identical models, pushes carry the group tag
    assert torch.equal(load_params(res.out_dir, "worker", 0), load_params(res.out_dir, "worker", 1))
    assert {s["group"] for s in spans(res.out_dir, "worker") if s["phase"] == "push"} == {0, 1}


# -- SSP bound ---------------------------------------------------------------------------------------
def test_ssp_never_runs_more_than_s_clocks_ahead(tmp_path_factory):
    s, steps = 1, 10
    config = cfg({"name": "ssp", "staleness": s}, steps,
                 slowdown=[{"hosts": ["b2"], "delay": {"dist": "constant", "value_s": 0.03}}])
    res = run(tmp_path_factory, "ssp", config)
    applies = assert_exactly_once(res.out_dir, range(WORKERS))
    # 1) the server's record of each reply: the clock the worker may start vs the slowest clock then
    replies = [p for p in spans(res.out_dir, "server") if p["phase"] == "pull" and p["step"] is not None]
    checked = [p for p in replies if "min_clock" in p]
    assert checked
    for p in checked:
        assert (p["step"] + 1) - p["min_clock"] <= s, p
    # 2) timing: worker w starts step k only after every other worker's step k-s-1 reached the server
    apply_start = {(a["client"], a["step"]): a["ts"] for a in applies}
    computes = [c for c in spans(res.out_dir, "worker") if c["phase"] == "compute"]
    for c in computes:
        k = c["step"] - s - 1
        if k < 0:
            continue
        for u in range(WORKERS):
            assert apply_start[(u, k)] <= c["ts"], (c, u)
    # 3) the bound actually bit: fast workers waited for the slow one
    waits = [w for w in spans(res.out_dir, "worker") if w["phase"] == "wait" and w.get("what") == "ssp_bound"]
    assert waits and {w["host"] for w in waits} - {"b2"}


# -- a crashing worker -------------------------------------------------------------------------------
def test_crashing_worker_stops_the_run_and_keeps_records(tmp_path):
    config = cfg({"name": "gsyn"}, 10_000, fault={"host": "b2", "step": 3})
    res = run_local(config, DCS, tmp_path, timeout_s=150, grace_s=2)
    # b2 fails; its ring peer b1 may notice in the same instant (gloo: peer closed)
    assert not res.ok and res.supervision.first_failure in ("b2.worker.3", "b1.worker.2"), res.reason
    procs = {p.name: p for p in res.supervision.procs}
    crashed = procs["b2.worker.3"]
    assert crashed.returncode == 1 and not crashed.stopped
    assert res.supervision.wall_s - crashed.ended_s < 8  # the others were stopped within seconds
    assert all(p.returncode is not None for p in procs.values())
    assert "injected fault" in res.log("b2.worker.3")
    mine = [s for s in spans(tmp_path, "worker") if s["host"] == "b2" and s["phase"] == "compute"]
    assert sorted(s["step"] for s in mine) == [0, 1, 2]
    assert spans(tmp_path, "server")  # the server's records survived its SIGTERM too


# -- stopping at a target ------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", [{"name": "bsp"}, {"name": "gsyn"}])
def test_stops_when_the_target_is_reached(tmp_path_factory, scheme):
    config = cfg(scheme, 5000, eval_every=5, save_model=False)
    config["stop"] = {"steps": 5000, "wall_s": 120, "target": {"metric": "acc", "value": 0.6}}
    res = run(tmp_path_factory, f"target-{scheme['name']}", config)
    rows = (res.out_dir / "metrics.csv").read_text().splitlines()[1:]
    accs = [float(r.split(",")[3]) for r in rows]
    assert max(accs) >= 0.6
    steps = [s["step"] for s in spans(res.out_dir, "worker") if s["phase"] == "compute"]
    assert max(steps) < 1000  # stopped long before the step budget
    if scheme["name"] == "gsyn":  # every member of a group ran the same steps
        by_host = collections.defaultdict(set)
        for s in spans(res.out_dir, "worker"):
            if s["phase"] == "compute":
                by_host[s["host"]].add(s["step"])
        assert by_host["a1"] == by_host["a2"] and by_host["b1"] == by_host["b2"]


@pytest.mark.parametrize("scheme", [{"name": "bsp"}, {"name": "gsyn"}])
def test_gives_up_on_a_hopeless_trial(tmp_path_factory, scheme):
    """``stop.give_up``: accuracy 0.99 is out of reach in a second, so the first evaluation past
    after_s stops every process (BSP's stop slot; the server's stop for Gsyn), long before the
    step budget and the wall cap, and the evaluation that did it says so."""
    config = cfg(scheme, 5000, eval_every=5, save_model=False)
    config["stop"] = {"steps": 5000, "wall_s": 120,
                      "give_up": {"metric": "acc", "value": 0.99, "after_s": 1.0}}
    res = run(tmp_path_factory, f"giveup-{scheme['name']}", config)
    evals = [s for s in spans(res.out_dir) if s["phase"] == "eval"]
    gave = [s for s in evals if s.get("gave_up")]
    assert len(gave) >= 1
    rows = [r.split(",") for r in (res.out_dir / "metrics.csv").read_text().splitlines()[1:]]
    assert float(rows[0][1]) == 0.0 and len(rows) >= 2  # the initial model, before after_s: kept going
    assert all(float(r[3]) < 0.99 for r in rows)
    first = min(float(r[1]) for r in rows if float(r[1]) >= 1.0)  # the first snapshot the rule judged
    assert max(float(r[1]) for r in rows) < first + 30  # stopped soon after, not at the 120 s cap
    steps = [s["step"] for s in spans(res.out_dir, "worker") if s["phase"] == "compute"]
    assert max(steps) < 1000  # stopped long before the step budget


# -- DiLoCo: H inner steps, outer Nesterov on the averaged outer gradient --------------------------
def diloco_reference(config, workers: int, steps: int):  # noqa: ANN201 - torch tensor
    """One process playing every worker in turn, under the stated DiLoCo semantics."""
    from testbed.training.config import validate_training
    from testbed.training.flat import FlatModel, make_optimizer
    from testbed.training.schemes.diloco import outer_step
    from testbed.training.workloads import build_workload

    tc = validate_training(config)
    p = tc.scheme.params
    wl = build_workload(tc.workload.name, tc.workload.params, tc.seed)
    local = [FlatModel(wl.build_model()) for _ in range(workers)]
    opts = [make_optimizer(tc.optimizer, m.plist) for m in local]
    theta, momentum, step = local[0].params.clone(), None, 0
    while step < steps:
        h = min(p.inner_steps, steps - step)
        for r in range(workers):
            for k in range(step, step + h):
                local[r].zero_grad()
                wl.loss(local[r].model, wl.batch(k, r, workers)).backward()
                opts[r].step()
        step += h
        grad = sum(theta - m.params for m in local) / workers
        momentum = outer_step(theta, grad, momentum, p.outer_lr, p.outer_momentum, p.nesterov)
        for m in local:
            m.load(theta)
    return theta


@pytest.mark.parametrize("steps,inner", [(8, 4), (10, 4)])  # the second ends with a short round
def test_diloco_equals_its_reference_and_syncs_every_h_steps(tmp_path_factory, steps, inner):
    config = cfg({"name": "diloco", "inner_steps": inner, "outer_lr": 0.7, "outer_momentum": 0.9}, steps)
    res = run(tmp_path_factory, f"diloco-{steps}", config)
    finals = [load_params(res.out_dir, "worker", r) for r in range(WORKERS)]
    for f in finals[1:]:
        assert torch.equal(f, finals[0])  # one global model after every round
    ref = diloco_reference(config, WORKERS, steps)
    assert torch.allclose(finals[0], ref, rtol=1e-5, atol=1e-6), (finals[0] - ref).abs().max()
    ws = spans(res.out_dir, "worker")
    outer = [s for s in ws if s["phase"] in ("wan_sync", "intra_sync") and s.get("what") == "outer"]
    rounds = sorted({s["step"] for s in outer})
    assert rounds == sorted({min(k, steps) - 1 for k in range(inner, steps + inner, inner)})
    assert len(outer) == WORKERS * len(rounds) and all(s["bytes"] > 0 for s in outer)
    inner_applies = [s for s in ws if s["phase"] == "apply" and s.get("what") == "inner"]
    assert len(inner_applies) == WORKERS * steps
    rows = (res.out_dir / "metrics.csv").read_text().splitlines()
    last = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert int(last["updates"]) == len(rounds)  # updates = outer steps


def test_gsyn_groups_do_not_wait_for_each_other(tmp_path_factory):
    """Asynchrony between groups, measured: with DC b's compute 0.1 s slower per step, group a
    pushes all its updates while group b is still in the first half of its own.  A barrier
    across groups (any lock-step between them) would keep a within a step or two of b."""
    steps = 12
    config = cfg({"name": "gsyn"}, steps, slowdown=[{"dcs": ["b"], "delay": {"dist": "constant", "value_s": 0.1}}])
    res = run(tmp_path_factory, "gsyn-async", config)
    pushes = sorted((s for s in spans(res.out_dir, "worker") if s["phase"] == "push"), key=lambda s: s["ts"])
    by_group = {g: [s for s in pushes if s["group"] == g] for g in (0, 1)}
    assert [len(v) for v in by_group.values()] == [steps, steps]
    fast_done = by_group[0][-1]["ts"] + by_group[0][-1]["dur"]
    slow_done_before = sum(1 for s in by_group[1] if s["ts"] + s["dur"] <= fast_done)
    print(f"group b had pushed {slow_done_before}/{steps} when group a finished")
    assert slow_done_before <= steps // 2, (slow_done_before, "group b kept pace: the groups are coupled")


def test_gsyn_group_spanning_dcs_counts_its_broadcast_as_wan(tmp_path_factory):
    """Explicit groups across DCs ({a1, b1}, {a2, b2}): the leader's model broadcast crosses the WAN,
    so it is a wan_sync span whose wan_bytes are the model bytes sent to the member in the other DC."""
    steps = 4
    config = cfg({"name": "gsyn", "groups": [["a1", "b1"], ["a2", "b2"]]}, steps)
    res = run(tmp_path_factory, "gsyn-cross", config)
    ws = spans(res.out_dir, "worker")
    bcasts = [s for s in ws if s.get("op") == "broadcast"]
    leaders = [s for s in bcasts if s["bytes"]]
    assert leaders and {s["host"] for s in leaders} == {"a1", "a2"}
    assert all(s["phase"] == "wan_sync" and s["wan_bytes"] == s["bytes"] for s in leaders)  # one member, remote
    assert all(s["phase"] == "wan_sync" for s in bcasts)
    members = [s for s in bcasts if not s["bytes"]]
    assert members and all(s["wan_bytes"] == 0 for s in members)  # receivers count nothing (no double count)
    # in-DC groups (the default: one per DC) stay intra_sync with no WAN bytes
    res = run(tmp_path_factory, "gsyn-dc", cfg({"name": "gsyn"}, steps))
    bc = [s for s in spans(res.out_dir, "worker") if s.get("op") == "broadcast"]
    assert bc and all(s["phase"] == "intra_sync" and s["wan_bytes"] == 0 for s in bc)
