"""Validation of the training section, job files and groups (no torch)."""

from __future__ import annotations

import json

import pytest

from testbed.training.config import validate_training
from testbed.training.jobs import Job, Placement, make_jobs
from traffic_control.errors import ValidationError

WORKERS = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
BASE = {"workload": "digits", "scheme": "bsp"}


def bad(cfg, field, workers=WORKERS):
    with pytest.raises(ValidationError) as ei:
        validate_training(cfg, workers)
    assert ei.value.field == field, (ei.value.field, str(ei.value))
    assert ei.value.fix
    return ei.value


def test_defaults_round_trip():
    tc = validate_training(BASE, WORKERS)
    assert tc.workload.params.batch_size == 32
    assert tc.stop.steps == 100 and tc.device == "auto" and tc.threads == 1
    again = validate_training(json.loads(json.dumps(tc.to_dict())))
    assert again == tc


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({"workload": "mnist", "scheme": "bsp"}, "training.workload.name"),
        ({"workload": "digits", "scheme": "allgather"}, "training.scheme.name"),
        ({"workload": "digits"}, "training.scheme"),
        ({"workload": "digits", "scheme": {"name": "ssp", "staleness": -1}}, "training.scheme.staleness"),
        ({"workload": "digits", "scheme": {"name": "gsyn", "groups": 5}}, "training.scheme.groups"),
        ({"workload": "digits", "scheme": {"name": "gsyn", "groups": 0}}, "training.scheme.groups"),
        ({"workload": "digits", "scheme": {"name": "gsyn", "groups": [["a1", "a2"], ["b1", "zz"]]}},
         "training.scheme.groups[1]"),
        ({"workload": "digits", "scheme": {"name": "gsyn", "groups": [["a1", "a2"], ["b1"]]}},
         "training.scheme.groups"),
        ({"workload": "digits", "scheme": {"name": "gsyn", "groups": [["a1", "a2"], ["a2", "b1", "b2"]]}},
         "training.scheme.groups[1]"),
        ({"workload": "digits", "scheme": {"name": "bsp", "allreduce": "tree"}}, "training.scheme.allreduce"),
        ({"workload": {"name": "digits", "batch": 3}, "scheme": "bsp"}, "training.workload.batch"),
        ({"workload": {"name": "charlm", "d_model": 50, "n_heads": 4}, "scheme": "bsp"}, "training.workload.n_heads"),
        ({"workload": {"name": "charlm", "domain": "crypto"}, "scheme": "bsp"}, "training.workload.domain"),
        ({"workload": {"name": "synthetic", "grad_bytes": 10}, "scheme": "bsp"}, "training.workload.grad_bytes"),
        ({**BASE, "stop": {"steps": None}}, "training.stop.steps"),
        ({**BASE, "stop": {"steps": 0}}, "training.stop.steps"),
        ({**BASE, "stop": {"target": {"metric": "f1", "value": 1}}}, "training.stop.target.metric"),
        ({**BASE, "device": "tpu"}, "training.device"),
        ({**BASE, "threads": "two"}, "training.threads"),
        ({**BASE, "optimizer": {"lr": 0}}, "training.optimizer.lr"),
        ({**BASE, "slowdown": [{"hosts": ["c9"], "factor": 2}]}, "training.slowdown[0].hosts"),
        ({**BASE, "slowdown": [{"dcs": ["c"], "factor": 2}]}, "training.slowdown[0].dcs"),
        ({**BASE, "slowdown": [{"factor": 0.5}]}, "training.slowdown[0].factor"),
        ({**BASE, "slowdown": [{"delay": {"dist": "uniform", "low_s": 0.1}}]}, "training.slowdown[0].delay.high_s"),
        ({**BASE, "slowdown": [{"delay": {"dist": "exponential", "mean_s": 0.1, "sigma": 1}}]},
         "training.slowdown[0].delay.sigma"),
        ({**BASE, "server_port": 29500}, "training.server_port"),
        ({**BASE, "fault": {"step": 1, "host": "nohost"}}, "training.fault.host"),
        ({**BASE, "colour": "red"}, "training.colour"),
    ],
)
def test_bad_configs_name_the_field(cfg, field):
    bad(cfg, field)


def test_checks_needing_hosts_wait_for_them():
    cfg = {"workload": "digits", "scheme": {"name": "gsyn", "groups": 9}}
    validate_training(cfg)  # hosts unknown: fine
    bad(cfg, "training.scheme.groups")


def placement():
    return [Placement(h, d, f"10.0.{i}.2", f"{h}-eth0") for i, (h, d) in enumerate(WORKERS.items())] + [
        Placement("ps", "a", "10.0.9.2", "ps-eth0", role="server")
    ]


def test_make_jobs_gsyn_groups_and_slowdown(tmp_path):
    cfg = {"workload": "digits", "scheme": {"name": "gsyn"},
           "slowdown": [{"dcs": ["b"], "factor": 2.0}, {"hosts": ["b2"], "factor": 1.5,
                                                         "delay": {"dist": "exponential", "mean_s": 0.01}}]}
    jobs = make_jobs(cfg, placement(), tmp_path, 123)
    assert [j.role for j in jobs] == ["worker"] * 4 + ["server"]
    assert jobs[0].groups == [[0, 1], [2, 3]]
    assert [j.group for j in jobs[:4]] == [0, 0, 1, 1]
    assert [j.slowdown_factor for j in jobs[:4]] == [1.0, 1.0, 2.0, 3.0]
    assert len(jobs[3].slowdown_delays) == 1
    w = jobs[2]
    assert (w.rendezvous_addr, w.server_addr, w.ifname, w.t0_ns) == ("10.0.0.2", "10.0.9.2", "b1-eth0", 123)
    assert jobs[4].rank == 4 and jobs[4].world_size == 4
    again = Job.from_json(w.to_json())
    assert again == w


def test_make_jobs_groups_by_count_and_list(tmp_path):
    jobs = make_jobs({"workload": "digits", "scheme": {"name": "gsyn", "groups": 3}}, placement(), tmp_path, 0)
    assert jobs[0].groups == [[0, 1], [2], [3]]
    jobs = make_jobs({"workload": "digits", "scheme": {"name": "gsyn", "groups": [["b2", "a1"], ["a2", "b1"]]}},
                     placement(), tmp_path, 0)
    assert jobs[0].groups == [[3, 0], [1, 2]]


def test_ps_scheme_needs_a_server(tmp_path):
    with pytest.raises(ValidationError) as ei:
        make_jobs({"workload": "digits", "scheme": "asp"}, placement()[:4], tmp_path, 0)
    assert ei.value.field == "training.scheme.name"
    jobs = make_jobs(BASE, placement(), tmp_path, 0)  # bsp ignores the server
    assert [j.role for j in jobs] == ["worker"] * 4
