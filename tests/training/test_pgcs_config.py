"""Validation of the ``experts`` workload and the ``pgcs`` / ``ddp_overlap`` schemes (no torch needed).

Bad input must raise ``ValidationError`` naming the field (the CLI turns it
into exit status 2 before anything starts).
"""

from __future__ import annotations

import json

import pytest

from testbed.training.config import validate_training
from testbed.training.schema import ValidationError

TINY = {"name": "experts", "experts": 2, "batch_size": 2, "seq_len": 8, "d_model": 8, "n_heads": 2,
        "n_layers": 1, "d_ff": 16}
WORKERS = {"a1": "a", "b1": "b"}


def _plan(dcs: list[str]) -> dict:
    tree = {"root": dcs[0], "parents": {d: dcs[0] for d in dcs[1:]}, "share": 1.0, "chunks": 2}
    return {"format": "blp-plan/1", "dcs": dcs, "size_bytes": 1000, "chunks": 2, "trees": [tree]}


def _field(cfg: dict, workers: dict | None = None) -> str:
    with pytest.raises(ValidationError) as ei:
        validate_training(cfg, workers)
    return ei.value.field


def test_good_configs_validate_and_round_trip(tmp_path):
    cfgs = [
        {"workload": TINY, "scheme": "pgcs"},
        {"workload": TINY, "scheme": {"name": "pgcs", "overlap": False, "sync": "hierarchical", "experts": 2}},
        {"workload": {"name": "synthetic", "params": 1000}, "scheme": {"name": "pgcs", "experts": 4}},
        {"workload": TINY, "scheme": {"name": "ddp_overlap", "buckets": 3}},
        {"workload": TINY, "scheme": {"name": "pgcs", "sync": "blp", "plan": _plan(["a", "b"])}},
    ]
    pf = tmp_path / "plan.json"
    pf.write_text(json.dumps({"plan": _plan(["a", "b"])}))  # the CLI's --json wrapping is accepted too
    cfgs.append({"workload": TINY, "scheme": {"name": "pgcs", "sync": "blp", "plan_file": str(pf)}})
    for cfg in cfgs:
        tc = validate_training(cfg, WORKERS)
        again = validate_training(tc.to_dict(), WORKERS)
        assert again.to_dict() == tc.to_dict()
    tc = validate_training(cfgs[2])
    assert tc.scheme.params.expert_count(tc.workload.name, tc.workload.params) == 4
    tc = validate_training(cfgs[0])
    assert tc.scheme.params.expert_count(tc.workload.name, tc.workload.params) == 2
    assert tc.workload.params.expert_domains() == ["email", "text"]


@pytest.mark.parametrize("cfg, field", [
    ({"workload": dict(TINY, experts=1), "scheme": "pgcs"}, "training.workload.experts"),
    ({"workload": dict(TINY, experts=3, domains=["email", "xml"]), "scheme": "pgcs"}, "training.workload.domains"),
    ({"workload": dict(TINY, domains=["email", "nope"]), "scheme": "pgcs"}, "training.workload.domains[1]"),
    ({"workload": dict(TINY, experts=12), "scheme": "pgcs"}, "training.workload.experts"),
    ({"workload": dict(TINY, d_model=9), "scheme": "pgcs"}, "training.workload.n_heads"),
    ({"workload": TINY, "scheme": {"name": "pgcs", "experts": 3}}, "training.scheme.experts"),
    ({"workload": {"name": "synthetic"}, "scheme": {"name": "pgcs", "experts": 1}}, "training.scheme.experts"),
    ({"workload": TINY, "scheme": {"name": "pgcs", "sync": "ring"}}, "training.scheme.sync"),
    ({"workload": TINY, "scheme": {"name": "pgcs", "overlap": "yes"}}, "training.scheme.overlap"),
    ({"workload": TINY, "scheme": {"name": "ddp_overlap", "buckets": 0}}, "training.scheme.buckets"),
    ({"workload": TINY, "scheme": {"name": "ddp_overlap", "overlap": False}}, "training.scheme.overlap"),
    ({"workload": TINY, "scheme": {"name": "pgcs", "plan": _plan(["a", "b"])}}, "training.scheme.plan"),
    ({"workload": TINY, "scheme": {"name": "pgcs", "sync": "blp", "plan": _plan(["a", "b"]), "plan_file": "x"}},
     "training.scheme.plan_file"),
    ({"workload": TINY, "scheme": {"name": "pgcs", "sync": "blp", "plan": {"dcs": ["a"]}}},
     "training.scheme.plan.size_bytes"),
    ({"workload": TINY, "scheme": {"name": "pgcs", "sync": "blp", "plan_file": "/nonexistent/plan.json"}},
     "training.scheme.plan_file"),
])
def test_bad_configs_name_the_field(cfg, field):
    assert _field(cfg) == field


def test_plan_must_cover_the_workers_dcs(tmp_path):
    cfg = {"workload": TINY, "scheme": {"name": "pgcs", "sync": "blp", "plan": _plan(["a", "c"])}}
    validate_training(cfg)  # without the hosts there is nothing to compare against
    assert _field(cfg, WORKERS) == "training.scheme.plan.dcs"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert _field({"workload": TINY, "scheme": {"name": "pgcs", "sync": "blp", "plan_file": str(bad)}}) == \
        "training.scheme.plan_file"
