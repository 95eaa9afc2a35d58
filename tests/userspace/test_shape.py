"""ImpairmentShape: validation names the field; conversion from other shape objects."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from traffic_control.errors import ValidationError
from traffic_control.userspace import ImpairmentShape


def test_defaults_are_transparent() -> None:
    s = ImpairmentShape()
    assert (s.delay_s, s.jitter_s, s.loss_pct, s.reorder) == (0.0, 0.0, 0.0, False)
    assert not s.reorders


@pytest.mark.parametrize(("changes", "field"), [
    ({"delay_s": -0.001}, "delay_s"),
    ({"delay_s": 20.0 * 1000}, "delay_s"),
    ({"jitter_s": -1.0}, "jitter_s"),
    ({"loss_pct": 101.0}, "loss_pct"),
    ({"loss_pct": float("nan")}, "loss_pct"),
    ({"distribution": "lognormal"}, "distribution"),
    ({"limit": 0}, "limit"),
    ({"seed": 1.5}, "seed"),
    ({"reorder": "yes"}, "reorder"),
])
def test_invalid_values_name_their_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ImpairmentShape(**changes)  # type: ignore[arg-type]
    assert info.value.field == field


def test_dict_round_trip_and_unknown_field() -> None:
    s = ImpairmentShape(delay_s=0.02, jitter_s=0.001, distribution="normal", reorder=True, loss_pct=1.5, seed=7)
    assert ImpairmentShape.from_dict(s.to_dict()) == s
    with pytest.raises(ValidationError) as info:
        ImpairmentShape.from_dict({"delay": 0.02}, field="links[0].forward")
    assert info.value.field == "links[0].forward.delay"
    with pytest.raises(ValidationError) as info:
        ImpairmentShape.from_dict({"delay_s": -1}, field="links[0].forward")
    assert info.value.field == "links[0].forward.delay_s"


def test_from_any_reads_a_linkshape_like_object() -> None:
    link = SimpleNamespace(rate_bps=1e8, delay_s=0.02, jitter_s=0.002, loss_pct=0.1, reorder=False, limit=None)
    s = ImpairmentShape.from_any(link, seed=3)
    assert (s.delay_s, s.jitter_s, s.loss_pct, s.seed) == (0.02, 0.002, 0.1, 3)
    assert s.limit == ImpairmentShape().limit  # None means: keep the default
    assert ImpairmentShape.from_any({"delay_s": 0.01, "limit": 500.0}).limit == 500


@pytest.mark.parametrize("name", ["", "x" * 16, "a b", "a/b", "a:b", 'a"b'])
def test_bad_interface_names_are_refused(name: str) -> None:
    from traffic_control.userspace.control import check_ifname

    with pytest.raises(ValidationError):
        check_ifname(name)


def test_good_interface_names_pass() -> None:
    from traffic_control.userspace.control import check_ifname

    for name in ("r1-eth1", "dc0r-wan3", "x" * 15):
        check_ifname(name)
