"""Gilbert-Elliott loss, duplication and corruption: the spec, netem's encoding, the userspace model, refusals.

The live measurements are in ``tests/netem`` (the lab for netem, natively for
the userspace backend); these check what they stand on without root.
"""

from __future__ import annotations

import pytest

from testbed.network import impairment as uimp
from testbed.network.emulation import Impairment, check_backend_features
from topologies import from_dict
from traffic_control import netem_codec
from traffic_control.errors import ValidationError
from traffic_control.qdisc import build_ops, change_ops, leaf_op
from traffic_control.shape import LinkShape
from traffic_control.userspace.schedule import Scheduler
from traffic_control.userspace.shape import ImpairmentShape

from .netem_round_trip import netem_round_trip

GE = {"p": "1%", "r": "25%"}


def _runs(lost: list[bool]) -> list[int]:
    runs, c = [], 0
    for x in lost:
        if x:
            c += 1
        elif c:
            runs.append(c)
            c = 0
    return runs


def test_spec_fields_parse_round_trip_and_describe():
    s = LinkShape.from_dict({"rate": "10Mbit", "delay": "5ms", "gilbert_elliott": {**GE, "loss_bad": "80%"},
                             "duplicate": "2%", "corrupt": "0.5%"})
    assert (s.ge_p_pct, s.ge_r_pct, s.ge_loss_bad_pct, s.ge_loss_good_pct) == (1, 25, 80, 0)
    assert (s.duplicate_pct, s.corrupt_pct) == (2, 0.5)
    assert LinkShape.from_dict(s.to_dict()) == s
    assert s.to_dict()["gilbert_elliott"] == {"p": "1%", "r": "25%", "loss_bad": "80%"}
    assert s.expected_loss_pct == pytest.approx(1 / 26 * 80)
    assert "Gilbert-Elliott" in s.describe() and "duplicate 2%" in s.describe()
    assert s.needs_netem and LinkShape(duplicate_pct=1).needs_netem and LinkShape(corrupt_pct=1).needs_netem
    assert not s.without_netem().needs_netem


@pytest.mark.parametrize("spec,field,words", [
    ({"loss": "1%", "gilbert_elliott": GE}, "gilbert_elliott", "one loss model"),
    ({"gilbert_elliott": {"p": "1%", "r": "0%"}}, "gilbert_elliott.r", "never ends"),
    ({"gilbert_elliott": {"p": "1%"}}, "gilbert_elliott.r", ""),
    ({"duplicate": "120%"}, "duplicate", "<= 100"),
    ({"gilbert_elliott": {"p": "1%", "r": "5%", "bad": "1%"}}, "gilbert_elliott.bad", "unknown key"),
])
def test_bad_loss_models_name_the_field(spec, field, words):
    with pytest.raises(ValidationError) as e:
        LinkShape.from_dict(spec, "links[0]")
    assert e.value.field == f"links[0].{field}", str(e.value)
    assert words in str(e.value)


def test_netem_encoding_round_trips_through_pyroute2():
    shape = LinkShape(delay_s=0.01, ge_p_pct=1, ge_r_pct=25, ge_loss_bad_pct=90, ge_loss_good_pct=0.5,
                      duplicate_pct=2, corrupt_pct=1.5)
    op = leaf_op(shape, "change", True, seed=7)
    back = netem_round_trip(dict(op.params, delay=10000, jitter=0))
    ge = netem_codec.gemodel_of(back)
    assert ge == pytest.approx({"ge_p_pct": 1, "ge_r_pct": 25, "ge_loss_bad_pct": 90, "ge_loss_good_pct": 0.5})
    assert netem_codec.corrupt_pct_of(back) == pytest.approx(1.5)
    assert back["duplicate"] / netem_codec.U32_MAX * 100 == pytest.approx(2)
    assert back["loss"] == 0
    # tc's words in the dry run: gemodel p r 1-h 1-k
    assert "loss gemodel 1% 25% 90% 0.5% duplicate 2% corrupt 1.5%" in " ".join(op.argv)


def test_clearing_corruption_and_the_model_is_an_explicit_change():
    """The kernel keeps a corruption probability a change does not send: a cleared one is sent as 0; a
    change without TCA_NETEM_LOSS returns netem to independent loss."""
    old = LinkShape(delay_s=0.01, corrupt_pct=1, ge_p_pct=1, ge_r_pct=25)
    new = LinkShape(delay_s=0.01)
    ops = change_ops(old, new, netem=True)
    assert len(ops) == 1 and ops[0].params["corrupt"] == 0 and "gemodel" not in ops[0].params
    from pyroute2.netlink.rtnl.tcmsg import sched_netem

    netem_codec.install()
    attrs = sched_netem.get_parameters(dict(ops[0].params, rate=None))["attrs"]
    assert ["TCA_NETEM_CORRUPT", {"prob_corrupt": 0, "corr_corrupt": 0}] in attrs
    assert not any(a[0] == "TCA_NETEM_LOSS" for a in attrs)
    assert build_ops(old, netem=True)[-1].params["gemodel"] == (1, 25, 100, 0)


def test_userspace_gilbert_elliott_gives_the_stationary_rate_in_bursts():
    """The daemon's model: loss rate p/(p+r) (3.85 %) in runs of mean 1/r (4) packets; Bernoulli loss at
    the same rate has runs of ~1.04 (the measurement that would fail if bursts were lost)."""
    n = 200_000
    ge = Scheduler(ImpairmentShape(ge_p_pct=1, ge_r_pct=25, seed=3))
    lost = [not ge.admit(i, i * 1e-4) for i in range(n)]
    rate = sum(lost) / n
    runs = _runs(lost)
    assert rate == pytest.approx(1 / 26, rel=0.1)
    assert sum(runs) / len(runs) == pytest.approx(4, rel=0.1)
    flat = Scheduler(ImpairmentShape(loss_pct=100 / 26, seed=3))
    runs = _runs([not flat.admit(i, i * 1e-4) for i in range(n)])
    assert sum(runs) / len(runs) < 1.1


def test_userspace_backend_refuses_duplicate_and_corrupt_before_building():
    topo = from_dict({"name": "t", "dcs": ["a", {"name": "b", "lan": {"rate": "1Gbit", "corrupt": "1%"}}],
                      "links": [{"a": "a", "b": "b", "rate": "10Mbit", "reverse": {"duplicate": "1%"}}]})
    with pytest.raises(ValidationError) as e:
        check_backend_features(topo, Impairment("userspace", True))
    assert e.value.field == "links[0].reverse.duplicate" and "netem" in e.value.fix
    check_backend_features(topo, Impairment("netem", True))  # netem does both
    with pytest.raises(ValidationError) as e:
        uimp.to_impairment_shape(LinkShape(corrupt_pct=1))  # net set and schedules go through here
    assert e.value.field == "corrupt"


def test_verify_loss_interval_covers_gilbert_elliott_counts():
    """``net verify --delays`` bounds a Gilbert-Elliott link's lost count with the chain's variance: ~99 % of
    simulated trains fall inside (a binomial interval, far too narrow for bursts, holds about half)."""
    from testbed.network.delay_check import binomial_interval, loss_interval

    shape = LinkShape(delay_s=0.01, ge_p_pct=1, ge_r_pct=25)
    n, trials = 2000, 300
    lo, hi = loss_interval(n, shape)
    blo, bhi = binomial_interval(n, shape.expected_loss_pct / 100)
    inside = binomial_inside = 0
    for t in range(trials):
        s = Scheduler(ImpairmentShape(ge_p_pct=1, ge_r_pct=25, seed=1000 + t))
        lost = sum(not s.admit(i, i * 1e-4) for i in range(n))
        inside += lo <= lost <= hi
        binomial_inside += blo <= lost <= bhi
    assert inside / trials >= 0.96, (inside, lo, hi)
    assert binomial_inside / trials < 0.85  # the measurement that shows why the model's interval is needed
    assert loss_interval(n, LinkShape(delay_s=0.01, loss_pct=2)) == binomial_interval(n, 0.02)


def test_netem_refuses_a_gilbert_elliott_chain_the_jitter_driver_would_restart():
    """netem restarts the chain in its good state at every change carrying the model (get_loss_clg), and the
    jitter driver changes an order-kept jittered leaf every interval: refused before anything is built."""
    from testbed.network.emulation import Impairment, check_backend_features
    from topologies import from_dict

    def topo(**extra):
        return from_dict({"name": "ge", "dcs": ["a", "b"], "links": [
            {"a": "a", "b": "b", "delay": "10ms", "forward": {"gilbert_elliott": {"p": "1%", "r": "25%"}, **extra}}]})

    with pytest.raises(ValidationError) as e:
        check_backend_features(topo(jitter="2ms"), Impairment("netem", True))
    assert e.value.field == "links[0].forward.gilbert_elliott" and "reorder: true" in str(e.value)
    check_backend_features(topo(jitter="2ms", reorder=True), Impairment("netem", True))  # netem's own draws
    check_backend_features(topo(jitter="2ms"), Impairment("userspace", False))  # the daemon keeps its state
    check_backend_features(topo(), Impairment("netem", True))  # no jitter, no driver
