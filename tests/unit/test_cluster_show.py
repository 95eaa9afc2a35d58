"""``net show --cluster``'s merge of every server's answer (testbed.cluster.show), without servers."""

from __future__ import annotations

from testbed.cluster.show import describe, merge
from testbed.network.cli import _daemon_line, _describe_kernel

LINE = {"name": "line3", "dcs": [{"name": n, "hosts": 1} for n in "abc"],
        "links": [{"a": "a", "b": "b", "rate": "50Mbit", "delay": "5ms"},
                  {"a": "b", "b": "c", "rate": "50Mbit", "delay": "5ms"}]}


def _link(node: str, rate: float) -> dict:
    return {"node": node, "ifname": "eth1", "spec": {}, "link": {"admin_up": True, "mtu": 1500},
            "tc": {"shape": {"rate_bps": rate, "delay_s": 0.005, "limit": 40}}}


def _daemon(node: str, alive: bool = True) -> dict:
    return {"node": node, "ifname": "eth1", "realises": "x", "alive": alive, "state": "running" if alive else "dead",
            "reason": "" if alive else "killed", "pid": 7}


def _part(dcs: list[str], links: dict, daemons: list) -> dict:
    return {"ok": True, "report": {"state": {"topology": LINE, "part": {"dcs": dcs, "tunnels": {"a-b": {}}},
                                             "nodes": {"x": {}}, "impairment": {"backend": "userspace"}},
                                   "links": links, "impairment_health": daemons}}


def test_every_direction_is_listed_with_the_server_that_shapes_it():
    answers = {"s1": _part(["a"], {"a->b": _link("a-r", 50e6)}, [_daemon("a-r")]),
               "s2": _part(["b", "c"], {k: _link("b-r", 50e6) for k in ("b->a", "b->c", "c->b")}, [_daemon("b-r")])}
    m = merge(answers)
    assert m["ok"] and m["mode"] == "emulate" and m["unreported"] == []
    assert {k: v["server"] for k, v in m["links"].items()} == {"a->b": "s1", "b->a": "s2", "b->c": "s2", "c->b": "s2"}
    text = "\n".join(describe(m, "s1", _describe_kernel, _daemon_line))
    assert "s1 (this machine): DCs a; 1 node(s), 1 tunnel(s), impairment userspace" in text
    assert "a->b         (s1) 50Mbit, delay 5ms" in text and "daemon s2 b-r:eth1 (x) pid 7: ok" in text


def test_a_silent_server_and_a_dead_daemon_fail_the_report_and_are_named():
    answers = {"s1": _part(["a"], {"a->b": _link("a-r", 50e6)}, [_daemon("a-r", alive=False)]),
               "s2": {"ok": False, "error": "s2: ssh failed: connection refused"}}
    m = merge(answers)
    assert not m["ok"] and m["unreported"] == ["b->a", "b->c", "c->b"]
    text = "\n".join(describe(m, "s1", _describe_kernel, _daemon_line))
    assert "s2: NO ANSWER: s2: ssh failed: connection refused" in text
    assert "b->c         UNREPORTED" in text and "daemon s1 a-r:eth1 (x) pid 7: DEAD" in text


def test_shape_mode_expects_every_pair_of_the_dcs_the_servers_shape_for():
    def shaped(dc: str, dst: str) -> dict:
        return {"ok": True, "report": {"state": {"mode": "shape", "shaping": {"dc": dc, "egress": [
            {"dst_dc": dst, "dst_server": "s"}]}}, "links": {f"{dc}->{dst}": {**_link("shape", 3e7),
                                                                             "path": [dc, "b", dst]}},
            "impairment_health": []}}

    m = merge({"s1": shaped("a", "c"), "s2": shaped("c", "a")})
    assert m["ok"] and m["mode"] == "shape" and sorted(m["links"]) == ["a->c", "c->a"]
    text = "\n".join(describe(m, "s1", _describe_kernel, _daemon_line))
    assert "a->c         (s1 via b) 30Mbit" in text and "s2: DCs c; shapes its egress to 1 DC(s)" in text
    m = merge({"s1": shaped("a", "c"), "s2": {"ok": False, "error": "no network up there"}})
    assert not m["ok"] and m["unreported"] == ["c->a"]
