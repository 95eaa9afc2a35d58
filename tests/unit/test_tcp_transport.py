"""The hosts' TCP congestion control: spec (default cubic, per DC, defaults) and the machine check."""

from __future__ import annotations

import pytest

from topologies.model import DEFAULT_CONGESTION_CONTROL, from_dict
from traffic_control import capabilities
from traffic_control.errors import ValidationError

BASE = {"name": "t", "dcs": ["a", {"name": "b", "tcp": {"congestion_control": "bbr"}}],
        "links": [{"a": "a", "b": "b", "rate": "100Mbit"}]}


def test_default_is_cubic_and_a_dc_may_choose():
    topo = from_dict(BASE)
    assert DEFAULT_CONGESTION_CONTROL == "cubic"
    assert topo.dc("a").congestion_control == "cubic" and topo.dc("b").congestion_control == "bbr"
    again = from_dict(topo.to_dict())
    assert again.dc("b").congestion_control == "bbr" and "tcp" not in topo.to_dict()["dcs"][0]


def test_defaults_apply_and_a_dc_overrides_them():
    topo = from_dict(dict(BASE, defaults={"tcp": {"congestion_control": "reno"}}))
    assert topo.dc("a").congestion_control == "reno" and topo.dc("b").congestion_control == "bbr"


def test_bad_names_are_refused_with_the_field():
    with pytest.raises(ValidationError) as e:
        from_dict(dict(BASE, dcs=["a", {"name": "b", "tcp": {"congestion_control": "BBR v2!"}}]))
    assert e.value.field == "dcs[1].tcp.congestion_control"
    with pytest.raises(ValidationError) as e:
        from_dict(dict(BASE, dcs=["a", {"name": "b", "tcp": {"cc": "bbr"}}]))
    assert "dcs[1].tcp" in e.value.field


def test_the_machine_check_names_the_fix(monkeypatch):
    monkeypatch.setattr(capabilities, "tcp_congestion_controls", lambda: (["reno", "bbr", "cubic"], ["reno", "bbr"], "bbr"))
    assert capabilities.congestion_control_problem("bbr") is None
    p = capabilities.congestion_control_problem("cubic")
    assert "not allowed in network namespaces" in p and "tcp_allowed_congestion_control='reno bbr cubic'" in p
    p = capabilities.congestion_control_problem("vegas")
    assert "modprobe tcp_vegas" in p


def test_preflight_raises_before_building(monkeypatch):
    from testbed.network.emulation import check_transport

    monkeypatch.setattr(capabilities, "tcp_congestion_controls", lambda: (["reno", "bbr"], ["reno", "bbr"], "bbr"))
    with pytest.raises(ValidationError) as e:
        check_transport(from_dict(BASE))
    assert e.value.field == "dcs[0].tcp.congestion_control" and "modprobe tcp_cubic" in e.value.fix
