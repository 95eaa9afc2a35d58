"""Gsyn planner: the waiting/staleness model, its edge cases, the CLI (no torch)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from testbed.training import cli
from testbed.training.gsyn_plan import ComputeDist, expected_max, load_spec, plan
from traffic_control.errors import ValidationError


def spec(**over):
    base = {
        "workers": [{"host": f"{dc}{i}", "dc": dc, "compute_s": {"mean": 0.05, "std": 0.01}}
                    for dc in "ab" for i in (1, 2)],
        "allreduce_s": {"intra_dc": 0.002, "cross_dc": 0.1},
        "server_rtt_s": 0.02,
    }
    base.update(over)
    return base


def test_expected_max_matches_closed_forms():
    assert expected_max([ComputeDist(mean=0.1), ComputeDist(mean=0.3)]) == pytest.approx(0.3)
    # max of two iid normals: mu + sigma/sqrt(pi)
    got = expected_max([ComputeDist(mean=1.0, std=0.1)] * 2)
    assert got == pytest.approx(1.0 + 0.1 / np.sqrt(np.pi), rel=1e-3)
    # samples: exact expectation of the max of two independent empirical draws
    s = [1.0, 2.0]
    assert expected_max([ComputeDist(samples=s)] * 2) == pytest.approx(1.75, rel=1e-3)
    # more members never wait less
    d = ComputeDist(mean=1.0, std=0.2)
    assert expected_max([d] * 4) > expected_max([d] * 2) > 1.0


def test_staleness_and_waiting_trade_off():
    p = plan(load_spec(spec()))
    by = {c.g: c for c in p.candidates}
    assert by[1].mean_staleness == 0
    assert by[2].mean_staleness == pytest.approx(1.0) and by[4].mean_staleness == pytest.approx(3.0)
    assert by[1].groups[0].wait_s > by[2].groups[0].wait_s > by[4].groups[0].wait_s  # waiting shrinks with G
    assert by[2].groups[0].hosts == ["a1", "a2"]  # G = #DCs: one group per DC, as gsyn runs it
    # with a slow WAN, G=1 pays cross-DC all-reduce every update: one group per DC wins
    assert p.best == 2
    # staleness free (beta=0): pure throughput favours many groups
    assert plan(load_spec(spec(staleness_penalty=0.0))).best == 4
    # fast WAN and a big staleness penalty: synchronous wins
    fast = spec(allreduce_s={"intra_dc": 0.002, "cross_dc": 0.003}, staleness_penalty=2.0)
    assert plan(load_spec(fast)).best == 1


def test_fit_to_measured_sweep_and_grouping_by_speed():
    measured = {1: 30.0, 2: 20.0, 4: 26.0}
    p = plan(load_spec(spec(staleness_penalty="fit", measured=measured, candidates=[1, 2, 4])))
    assert p.scale is not None and 0 <= p.beta <= 2
    for c in p.candidates:
        assert c.measured_s == measured[c.g] and c.predicted_s > 0
    workers = [{"host": "a1", "dc": "a", "compute_s": 0.2}, {"host": "a2", "dc": "a", "compute_s": 0.05},
               {"host": "b1", "dc": "b", "compute_s": 0.2}, {"host": "b2", "dc": "b", "compute_s": 0.05}]
    p = plan(load_spec(spec(workers=workers, grouping="speed", candidates=[2])))
    assert sorted(g.hosts for g in p.candidates[0].groups) == [["a1", "b1"], ["a2", "b2"]]


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"candidates": [5]}, "candidates[0]"),
        ({"server_rtt_s": {"a": 0.1}}, "server_rtt_s"),
        ({"staleness_penalty": "fit"}, "staleness_penalty"),
        ({"groups": {2: [["a1", "a2"], ["b1", "zz"]]}}, "groups.2[1]"),
        ({"workers": [{"host": "a1", "dc": "a", "compute_s": {"std": 0.1}}]}, "workers[0].compute_s.mean"),
        ({"allreduce_s": {"intra_dc": 0.1}}, "allreduce_s.cross_dc"),
    ],
)
def test_bad_specs(over, field):
    with pytest.raises(ValidationError) as ei:
        load_spec(spec(**over))
    assert ei.value.field == field, str(ei.value)


def test_cli(tmp_path, capsys):
    import yaml

    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(spec(measured={1: 10, 2: 8})))
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["gsyn-plan", str(path), "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["best"] == 2 and {c["g"] for c in out["candidates"]} == {1, 2, 3, 4}
    assert cli.main(["gsyn-plan", str(path)]) == 0
    assert "best G = 2" in capsys.readouterr().out
    path.write_text(yaml.safe_dump(spec(candidates=[9])))
    assert cli.main(["gsyn-plan", str(path)]) == 2
    assert "candidates[0]" in capsys.readouterr().err


def test_inputs_from_spans_feed_the_planner():
    from testbed.training.gsyn_plan import inputs_from_spans

    recs = []
    for host, dc, c in (("a1", "a", 0.05), ("a2", "a", 0.06), ("b1", "b", 0.1), ("b2", "b", 0.12)):
        for step in range(3):
            recs.append({"role": "worker", "host": host, "dc": dc, "phase": "compute", "step": step, "dur": int(c * 1e9)})
            recs.append({"role": "worker", "host": host, "dc": dc, "phase": "intra_sync", "op": "ring_allreduce",
                         "peers": 2, "step": step, "dur": 4_000_000})
            if host.endswith("1"):
                recs.append({"role": "worker", "host": host, "dc": dc, "phase": "push", "step": step, "dur": 1_000_000})
                recs.append({"role": "worker", "host": host, "dc": dc, "phase": "pull", "step": step, "dur": 9_000_000})
    data = inputs_from_spans(recs)
    assert data["server_rtt_s"] == {"a": pytest.approx(0.01), "b": pytest.approx(0.01)}
    assert data["allreduce_s"]["intra_dc"] == pytest.approx(0.004)
    p = plan(load_spec(data))
    assert {c.g for c in p.candidates} == {1, 2, 3, 4}


def test_inputs_from_spans_take_an_all_reduce_from_its_last_member_to_arrive():
    """A fast member's all-reduce span holds its wait for the straggler (the model counts that as
    waiting): one all-reduce gives the last arriver's span; other trials' steps are not matched."""
    from testbed.training.gsyn_plan import inputs_from_spans

    recs = []
    for trial, comm in (("t0", 0.2), ("t1", 0.4)):
        for step in range(5):
            for host, dc, wait in (("a1", "a", 1.0), ("a2", "a", 0.9), ("b1", "b", 0.0)):
                recs.append({"role": "worker", "host": host, "dc": dc, "phase": "wan_sync", "op": "ring_allreduce",
                             "peers": 3, "group": 0, "step": step, "trial": trial, "dur": int((wait + comm) * 1e9)})
    data = inputs_from_spans(recs)
    # ten all-reduces, half of 0.2 s and half of 0.4 s, rescaled by m / (2(m-1)) = 3/4
    assert data["allreduce_s"]["cross_dc"] == pytest.approx(0.3 * 0.75)


def test_inputs_from_spans_list_workers_in_rank_order():
    """The planner's ``grouping: run`` forms groups from the workers' order as gsyn does from the
    ranks, so the order records happen to be read in must not change which hosts share a group."""
    from testbed.training.gsyn_plan import inputs_from_spans

    recs = [{"role": "worker", "host": h, "dc": h[0], "rank": rank, "phase": "compute", "step": 0, "dur": 10**8}
            for h, rank in (("w2", 5), ("e1", 0), ("w1", 4), ("c2", 3), ("e2", 1), ("c1", 2))]
    assert [w["host"] for w in inputs_from_spans(recs)["workers"]] == ["e1", "e2", "c1", "c2", "w1", "w2"]


def test_plan_vs_sweep_keeps_censored_groups_apart(tmp_path):
    """benchmarks/gsyn_plan_vs_sweep.py on a sweep where G = 1 never reached the target: G = 1 is
    listed as censored (0 of 2), not dropped and not averaged, and the planner still ranks it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    hosts = (("e1", "e", 0, 0.5), ("e2", "e", 1, 0.5), ("w1", "w", 2, 1.5), ("w2", "w", 3, 1.5))
    reached = {1: [None, None], 2: [40.0, 44.0], 4: [30.0, 34.0]}
    for g, ttts in reached.items():
        point = tmp_path / "sweep" / "points" / f"p{g}"
        point.mkdir(parents=True)
        (point / "done.json").write_text("{}")
        for r, t in enumerate(ttts):
            trial = point / "trials" / f"gsyn-g{g}-r{r}"
            (trial / "events").mkdir(parents=True)
            (trial / "manifest.json").write_text(json.dumps(
                {"training": {"scheme": {"name": "gsyn", "groups": g}}, "target": {"acc": 0.9}}))
            rows = ["wall_s,loss,acc", "10,1.0,0.5"] + ([f"{t},0.2,0.95"] if t is not None else ["300,0.5,0.8"])
            (trial / "metrics.csv").write_text("\n".join(rows) + "\n")
            spans = [{"role": "worker", "host": h, "dc": dc, "rank": rank, "phase": "compute", "step": k,
                      "dur": int(c * 1e9)} for h, dc, rank, c in hosts for k in range(3)]
            spans += [{"role": "worker", "host": h, "dc": dc, "rank": rank, "phase": ph, "step": 0, "dur": 10**7}
                      for h, dc, rank, _ in hosts for ph in ("push", "pull")]
            (trial / "events" / "w.jsonl").write_text("\n".join(json.dumps(x) for x in spans) + "\n")
    out = subprocess.run([sys.executable, str(repo / "benchmarks" / "gsyn_plan_vs_sweep.py"),
                          str(tmp_path / "sweep")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "G = 1: reached the target in 0 of 2 trials" in out.stdout
    assert "G = 2: reached the target in 2 of 2 trials; mean of those 42.00 s" in out.stdout
    assert "measured best G = 4" in out.stdout
    table = out.stdout.split("staleness penalty 0.5")[1]
    assert any(line.split()[:1] == ["1"] for line in table.splitlines())  # G = 1 still planned
