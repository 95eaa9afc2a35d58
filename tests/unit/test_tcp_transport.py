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


def test_socket_buffers_default_per_dc_and_defaults():
    from testbed.network.addressing import plan_network
    from testbed.network.emulation import node_sysctls, tcp_mem
    from topologies.model import DEFAULT_TCP_BUFFER

    topo = from_dict(dict(BASE, defaults={"tcp": {"send_buffer": "1MiB"}},
                          dcs=["a", {"name": "b", "tcp": {"receive_buffer": "256KiB", "send_buffer": "64KiB"}}]))
    a, b = topo.dc("a"), topo.dc("b")
    assert (a.receive_buffer, a.send_buffer) == (DEFAULT_TCP_BUFFER, 2**20)
    assert (b.receive_buffer, b.send_buffer) == (256 * 1024, 64 * 1024)
    # sysctls: the ceiling is the spec's; Linux's initial 128 KiB never above it
    assert tcp_mem(64 * 1024) == "4096 65536 65536" and tcp_mem(2**20) == "4096 131072 1048576"
    cmds = node_sysctls(topo, plan_network(topo).nodes["b-h1"])
    assert "net.ipv4.tcp_rmem='4096 131072 262144'" in cmds and "net.ipv4.tcp_wmem='4096 65536 65536'" in cmds
    again = from_dict(topo.to_dict())
    assert again.dc("b").send_buffer == 64 * 1024 and again.dc("a").send_buffer == 2**20
    assert topo.to_dict()["dcs"][1]["tcp"] == {"receive_buffer": "256KiB", "send_buffer": "64KiB"}


@pytest.mark.parametrize("value, why", [("1KiB", "receive_buffer"), ("4GiB", "receive_buffer"), ("100Mbit", "receive_buffer")])
def test_bad_buffer_sizes_name_the_field(value, why):
    with pytest.raises(ValidationError) as e:
        from_dict(dict(BASE, dcs=["a", {"name": "b", "tcp": {"receive_buffer": value}}]))
    assert e.value.field == f"dcs[1].tcp.{why}"
