"""The lr rules' arithmetic for every bundled scheme, and that workers and the server use them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest

from testbed.training.config import validate_training
from testbed.training.jobs import Job, make_jobs
from testbed.training.lr import resolve, resolve_job, staleness_lr, update_workers
from testbed.training.schema import ValidationError

#: 4 workers in 2 DCs: a1 a2 | b1 b2
FOUR = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}


def tc(scheme, rule="linear", lr=0.1, batch=8, **opt):
    return validate_training({"workload": {"name": "digits", "batch_size": batch}, "scheme": scheme,
                              "optimizer": {"lr": lr, "lr_rule": rule, **opt}}, FOUR)


def groups_of(cfg):
    return cfg.scheme.params.resolve(list(FOUR.items())) if cfg.scheme.name == "gsyn" else None


@pytest.mark.parametrize("scheme, workers", [
    ({"name": "bsp", "allreduce": "ring"}, 4),
    ({"name": "bsp", "allreduce": "hierarchical"}, 4),
    ({"name": "pgcs"}, 4),
    ({"name": "ddp_overlap"}, 4),
    ("asp", 1),
    ({"name": "ssp", "staleness": 2}, 1),
    ({"name": "diloco", "inner_steps": 5}, 1),
])
def test_linear_rule_per_scheme(scheme, workers):
    cfg = tc(scheme)
    res = resolve(cfg, 4, groups_of(cfg))
    assert res.workers == workers
    assert res.effective_batch == workers * 8
    assert res.base_batch == 8  # default: the workload's batch size (one worker)
    assert res.lr == pytest.approx(0.1 * workers)


def test_gsyn_groups_two_and_one():
    cfg = validate_training({"workload": {"name": "digits", "batch_size": 8},
                             "scheme": {"name": "gsyn", "groups": [["a1", "a2"], ["b1"]]},
                             "optimizer": {"lr": 0.1, "lr_rule": "linear"}}, {"a1": "a", "a2": "a", "b1": "b"})
    res = resolve(cfg, 3, cfg.scheme.params.resolve([("a1", "a"), ("a2", "a"), ("b1", "b")]))
    assert res.workers == [2, 1]
    assert res.lr == pytest.approx([0.2, 0.1])
    assert res.for_client(0) == pytest.approx(0.2) and res.for_client(1) == pytest.approx(0.1)


def test_none_rule_keeps_the_given_lr_and_is_the_default():
    cfg = validate_training({"workload": "digits", "scheme": "bsp", "optimizer": {"lr": 0.3}}, FOUR)
    assert cfg.optimizer.lr_rule == "none" and not cfg.optimizer.staleness_aware
    assert resolve(cfg, 4).lr == pytest.approx(0.3)


def test_base_batch_and_sqrt_rule():
    assert resolve(tc("bsp", base_batch=16), 4).lr == pytest.approx(0.1 * 32 / 16)
    assert resolve(tc("bsp", rule="sqrt", name="adam"), 4).lr == pytest.approx(0.1 * 2.0)
    assert resolve(tc("asp", rule="sqrt"), 4).lr == pytest.approx(0.1)


def test_staleness_rule():
    assert staleness_lr(0.3, 3) == pytest.approx(0.1)
    assert staleness_lr(0.3, 0) == staleness_lr(0.3, 1) == staleness_lr(0.3, None) == pytest.approx(0.3)


def test_validation_names_the_field():
    with pytest.raises(ValidationError) as e:
        tc("bsp", base_batch=0)
    assert e.value.field == "training.optimizer.base_batch"
    with pytest.raises(ValidationError) as e:
        tc("bsp", rule="cubic")
    assert e.value.field == "training.optimizer.lr_rule"


@dataclass
class _PluginParams:
    uses_server: ClassVar[bool] = False


@dataclass
class _PluginPsParams:
    uses_server: ClassVar[bool] = True


@dataclass
class _PluginOwn:
    uses_server: ClassVar[bool] = False

    def update_workers(self, world_size, groups=None):
        return world_size // 2


def test_plugin_defaults_and_own_declaration():
    assert update_workers(_PluginParams(), 6) == 6  # no server: all workers averaged (BSP-like)
    assert update_workers(_PluginPsParams(), 6) == 1  # a server: one push per update
    assert update_workers(_PluginOwn(), 6) == 3


def test_plugin_example_declares_its_own():
    """The bundled plug-in example (local SGD) declares 1 worker per update."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples" / "plugins"
    sys.path.insert(0, str(root))
    try:
        cfg = validate_training({"workload": "tb_example:WORKLOAD", "scheme": "tb_example:SCHEME",
                                 "optimizer": {"lr": 0.1, "lr_rule": "linear"}}, FOUR)
        assert resolve(cfg, 4).lr == pytest.approx(0.1)
    finally:
        sys.path.remove(str(root))


def _jobs(tmp_path, scheme, workers, **opt):
    from testbed.training.local import loopback_placement

    cfg = {"workload": {"name": "digits", "batch_size": 4}, "scheme": scheme,
           "optimizer": {"lr": 0.1, "lr_rule": "linear", **opt}}
    return make_jobs(cfg, loopback_placement(workers), tmp_path, 0)


def test_job_file_records_the_lr_and_round_trips(tmp_path):
    jobs = _jobs(tmp_path, "bsp", {"a": 2, "b": 2})
    assert jobs[0].lr["lr"] == pytest.approx(0.4) and jobs[0].lr["rule"] == "linear"
    back = Job.from_json(jobs[0].to_json())
    assert resolve_job(back).for_client() == pytest.approx(0.4)


torch_mark = pytest.mark.torch


@torch_mark
def test_make_optimizer_uses_the_resolved_lr(tmp_path):
    torch = pytest.importorskip("torch")
    from testbed.training.flat import make_optimizer

    job = _jobs(tmp_path, "bsp", {"a": 2, "b": 2})[0]
    p = torch.nn.Parameter(torch.zeros(3))
    opt = make_optimizer(job.training.optimizer, [p], lr=resolve_job(job).for_client())
    p.grad = torch.ones(3)
    opt.step()
    assert torch.allclose(p.detach(), torch.full((3,), -0.4))
    assert make_optimizer(job.training.optimizer, [p]).param_groups[0]["lr"] == pytest.approx(0.1)


def _server(tmp_path, scheme, workers, **opt):
    from testbed.collect.recorder import Recorder
    from testbed.training.server import ParameterServer

    jobs = _jobs(tmp_path, scheme, workers, **opt)
    rec = Recorder(None, host="ps", role="server", rank=jobs[-1].rank, flush_interval_s=0)
    return ParameterServer(jobs[-1], rec, evaluate=False), rec


def _push(ps, client, version, seq, value=1.0):
    import numpy as np

    g = np.full(ps.flat.n, value, dtype=np.float32)
    before = ps.flat.params.clone()
    ps._apply(client, {"seq": seq, "step": seq, "version": version}, memoryview(bytearray(g.tobytes())))
    return float((before - ps.flat.params)[0])  # SGD, no momentum: the step is lr * 1.0


@torch_mark
def test_server_applies_per_group_lr_and_staleness(tmp_path):
    pytest.importorskip("torch")
    import json

    # Gsyn, one group per DC: a has 2 workers, b has 1 -> lr 0.2 and 0.1
    ps, rec = _server(tmp_path, "gsyn", {"a": 2, "b": 1}, staleness_aware=True)
    assert _push(ps, 0, 0, 0) == pytest.approx(0.2)  # staleness 0
    assert _push(ps, 1, 1, 0) == pytest.approx(0.1)  # staleness 0
    assert _push(ps, 0, 2, 1) == pytest.approx(0.2)
    assert _push(ps, 1, 0, 1) == pytest.approx(0.1 / 3)  # computed on version 0, applied at 3
    rec.flush()
    applies = [json.loads(x) for x in rec.lines if json.loads(x)["phase"] == "apply"]
    assert [round(a["lr"], 6) for a in applies] == [0.2, 0.1, 0.2, round(0.1 / 3, 6)]
    assert applies[-1]["staleness"] == 3


@torch_mark
def test_server_asp_without_staleness_rule(tmp_path):
    pytest.importorskip("torch")
    ps, _ = _server(tmp_path, "asp", {"a": 2, "b": 2})
    assert _push(ps, 0, 0, 0) == pytest.approx(0.1)
    assert _push(ps, 1, 0, 0) == pytest.approx(0.1)  # stale by 1, no staleness rule: full lr
    assert math.isclose(resolve_job(ps.job).for_client(), 0.1)
