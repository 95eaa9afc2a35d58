"""``stop.give_up``: the rule, the evaluators that apply it, and its validation.

The loopback runs that show a trial really stopping early (BSP's stop slot, the server's stop)
are in ``test_schemes.py``; the lr search's use of it in ``tests/experiments/test_lr_search.py``.
"""

from __future__ import annotations

import math

import pytest

from testbed.training.config import GiveUpConfig, validate_training
from testbed.training.evaluator import gives_up
from traffic_control.errors import ValidationError

torch = pytest.importorskip("torch")

LOSS = GiveUpConfig(metric="loss", value=2.0, after_s=60.0)


def test_the_rule():
    assert not gives_up(None, {"loss": math.nan}, 100.0)  # no rule: never
    assert not gives_up(LOSS, {"loss": 2.3}, 59.9)  # before after_s: chance-level loss is allowed
    assert gives_up(LOSS, {"loss": 2.3}, 60.0)
    assert not gives_up(LOSS, {"loss": 2.0}, 600.0)  # at value: not worse than it
    assert gives_up(LOSS, {"loss": math.nan}, 0.0) and gives_up(LOSS, {"loss": math.inf}, 1.0)  # at any time
    acc = GiveUpConfig(metric="acc", value=0.2, after_s=10.0)
    assert gives_up(acc, {"loss": 2.3, "acc": 0.1}, 10.0)
    assert not gives_up(acc, {"loss": 2.3, "acc": 0.25}, 10.0)
    assert not gives_up(acc, {"loss": 2.3}, 10.0)  # a workload without accuracy: no value to judge


@pytest.mark.parametrize("give_up, field", [
    ({"metric": "loss", "value": 2.0, "after_s": -1}, "training.stop.give_up.after_s"),
    ({"metric": "perplexity", "value": 2.0}, "training.stop.give_up.metric"),
    ({"value": 2.0}, "training.stop.give_up.metric"),
])
def test_bad_rules_name_the_field(give_up, field):
    with pytest.raises(ValidationError) as e:
        validate_training({"workload": "digits", "scheme": "bsp", "stop": {"steps": 5, "give_up": give_up}})
    assert e.value.field == field, str(e.value)


def test_the_rule_round_trips_through_the_job():
    tc = validate_training({"workload": "digits", "scheme": "bsp",
                            "stop": {"steps": 5, "give_up": {"metric": "loss", "value": 2.0, "after_s": "1min"}}})
    assert tc.stop.give_up == LOSS
    assert validate_training(tc.to_dict()).stop.give_up == LOSS  # what a worker process receives


def _evaluator(tmp_path, target=None, give_up=None):
    from testbed.collect.recorder import Recorder
    from testbed.training.evaluator import Evaluator
    from testbed.training.workloads import build_workload

    tc = validate_training({"workload": "digits", "scheme": "bsp", "stop": {"steps": 5}})
    wl = build_workload(tc.workload.name, tc.workload.params, 0)
    rec = Recorder(None, host="h", role="worker", rank=0)
    return Evaluator(wl, rec, tmp_path / "metrics.csv", target, give_up=give_up), wl


def test_the_evaluator_gives_up_on_a_hopeless_model_and_only_after_after_s(tmp_path):
    from testbed.training.flat import FlatModel

    rule = GiveUpConfig(metric="acc", value=0.99, after_s=1.0)  # an untrained model is far below 0.99
    ev, wl = _evaluator(tmp_path, give_up=rule)
    params = FlatModel(wl.build_model()).params
    ev.submit(0, 0, params, wall_s=0.0)
    ev.drain()
    assert not ev.done.is_set()  # before after_s
    ev.submit(1, 1, params, wall_s=1.5)
    ev.drain()
    assert ev.gave_up.is_set() and ev.done.is_set() and not ev.reached.is_set()
    ev.close()
    assert [r["wall_s"] for r in ev.writer.rows] == [0.0, 1.5]  # both evaluations written


def test_a_reached_target_is_not_a_give_up(tmp_path):
    from testbed.training.config import TargetConfig
    from testbed.training.flat import FlatModel

    ev, wl = _evaluator(tmp_path, target=TargetConfig("loss", 100.0), give_up=GiveUpConfig("loss", 0.0, 0.0))
    ev.submit(0, 0, FlatModel(wl.build_model()).params, wall_s=0.0)
    ev.drain()
    assert ev.reached.is_set() and ev.done.is_set() and not ev.gave_up.is_set()
    ev.close()


def test_several_models_one_hopeless_is_enough(tmp_path):
    """PGCS's experts: the target needs every expert; one expert past help gives the trial up."""
    from testbed.collect.recorder import Recorder
    from testbed.training.config import TargetConfig
    from testbed.training.evaluator import SnapshotEvaluator

    ev = SnapshotEvaluator(Recorder(None, host="h", role="worker", rank=0), tmp_path / "m.csv",
                           TargetConfig("loss", 1.0), "t", give_up=LOSS)
    ok, bad = {"loss": 0.5, "wall_s": 70.0}, {"loss": 2.5, "wall_s": 70.0}
    assert not ev._judge([ok], complete=False) and not ev.done.is_set()  # one expert at target: not all
    assert ev._judge([ok, bad], complete=True) and ev.gave_up.is_set() and not ev.reached.is_set()
    ev.close()
