"""`net up --dry-run` prints what the chosen backend would really do, not only the tc commands: the node
sysctls and GSO caps, the userspace backend's netfilter rules and daemons, netem's jitter driver."""

from __future__ import annotations

import yaml

from tests.conftest import run_cli

SPEC = {"name": "dry", "dcs": [{"name": "a", "hosts": 1, "lan": {"rate": "1Gbit", "delay": "1ms"}},
                               {"name": "b", "hosts": 1, "tcp": {"congestion_control": "reno"}}],
        "links": [{"a": "a", "b": "b", "rate": "100Mbit", "delay": "10ms", "jitter": "2ms"}]}


def _dry(tmp_path, backend: str, **extra) -> list[str]:
    f = tmp_path / "dry.yaml"
    f.write_text(yaml.safe_dump({**SPEC, **extra}))
    r = run_cli("net", "up", str(f), "--dry-run", "--impairment", backend)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_userspace_dry_run_names_rules_and_daemons(tmp_path):
    out = _dry(tmp_path, "userspace")
    rules = [ln for ln in out if " iptables " in ln and "NFQUEUE" in ln]
    # both WAN egresses and a's LAN switch (its bridge), each tagged for cleanup
    assert {ln.split()[3] for ln in rules} == {"tb-a-r", "tb-b-r", "tb-a-sw"}
    assert all("tc-userspace:" in ln and "POSTROUTING" in ln for ln in rules)
    daemons = [ln for ln in out if "-m traffic_control.userspace run" in ln]
    assert len(daemons) == 3 and all("'delay_s'" in ln for ln in daemons)
    assert any("bridge-nf-call-iptables=1" in ln and "tb-a-sw" in ln for ln in out)
    assert not any("jitter driver" in ln for ln in out)


def test_every_node_interface_gets_wire_sized_packets_and_its_sysctls(tmp_path):
    out = _dry(tmp_path, "userspace")
    gso = [ln for ln in out if ln.endswith("gso_max_segs 1")]
    # a-h1, b-h1 (one interface each), the parameter server absent (no ps), two routers with two each
    assert {(ln.split()[2], ln.split()[6]) for ln in gso} == {
        ("tb-a-h1", "eth0"), ("tb-b-h1", "eth0"), ("tb-a-r", "lan0"), ("tb-a-r", "w-b"), ("tb-b-r", "lan0"),
        ("tb-b-r", "w-a")}
    cc = {ln.split()[3]: ln for ln in out if "tcp_congestion_control=" in ln}
    assert "tcp_congestion_control=reno" in cc["tb-b-h1"] and "tcp_congestion_control=cubic" in cc["tb-a-h1"]
    assert not [ln for ln in _dry(tmp_path, "userspace", gso=True) if "gso_max_segs" in ln]


def test_netem_dry_run_names_the_jitter_driver(tmp_path):
    out = _dry(tmp_path, "netem")
    driver = [ln for ln in out if "jitter driver" in ln]
    assert len(driver) == 2 and all("every 20ms" in ln and "10ms +- 2ms" in ln for ln in driver)
    assert not any("NFQUEUE" in ln for ln in out)
