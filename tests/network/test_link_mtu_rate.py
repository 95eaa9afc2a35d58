"""The spec's ``mtu`` is the interfaces' MTU, and rates above 34.4 Gbit/s reach the kernel whole.

From the command line, network left up, probed from other processes: the
interfaces report the MTU; a don't-fragment packet of exactly the MTU crosses
a link and one byte more does not (``net verify``'s ``link_mtu`` row, and
``ping -M do`` here); a 100 Gbit/s link's HTB class reads back 100 Gbit/s
(32-bit rates stop at 2^32 - 1 bytes/s; this machine's veths cannot carry
34 Gbit/s, so the rate itself is read back, not measured).
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from testbed.network import cleanup
from tests.conftest import run_cli
from tests.network.helpers import require_root_tools

pytestmark = pytest.mark.root

SPEC = {"name": "mtu", "dcs": [{"name": "a", "hosts": 1, "lan": {"rate": "1Gbit", "mtu": 9000}},
                               {"name": "b", "hosts": 1}, {"name": "c", "hosts": 0}],
        "links": [{"a": "a", "b": "b", "rate": "100Gbit", "delay": "1ms", "mtu": 9000},
                  {"a": "b", "b": "c", "rate": "100Mbit", "delay": "1ms", "mtu": 1400}]}


def _ns(ns: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)


def _mtu(ns: str, ifname: str) -> int:
    return json.loads(_ns(ns, "ip", "-j", "link", "show", ifname).stdout)[0]["mtu"]


def _df_ping(ns: str, ip: str, payload: int) -> bool:
    return _ns(ns, "ping", "-n", "-q", "-M", "do", "-c", "1", "-W", "2", "-s", str(payload), ip).returncode == 0


def test_mtu_and_64_bit_rates_from_the_cli(tmp_path):
    require_root_tools()
    f = tmp_path / "mtu.yaml"
    f.write_text(yaml.safe_dump(SPEC))
    up = run_cli("net", "up", str(f), timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        shown = json.loads(run_cli("net", "show", "--json", timeout=120).stdout)
        links = shown["links"]
        assert links["a->b"]["link"]["mtu"] == 9000 and links["b->a"]["link"]["mtu"] == 9000
        assert links["b->c"]["link"]["mtu"] == 1400 and links["c->b"]["link"]["mtu"] == 1400
        assert links["a->b"]["tc"]["shape"]["rate_bps"] == pytest.approx(100e9)
        assert links["b->a"]["tc"]["shape"]["rate_bps"] == pytest.approx(100e9)
        assert _mtu("tb-a-h1", "eth0") == 9000 and _mtu("tb-a-r", "lan0") == 9000 and _mtu("tb-b-h1", "eth0") == 1500
        a_ip = json.loads(_ns("tb-a-h1", "ip", "-j", "-4", "addr", "show", "eth0").stdout)[0]["addr_info"][0]["local"]
        # LAN of a at 9000: host to its router, exactly the MTU and not one byte more
        gw = a_ip.rsplit(".", 1)[0] + ".254"
        assert _df_ping("tb-a-h1", gw, 9000 - 28) and not _df_ping("tb-a-h1", gw, 9000 - 27)
    finally:
        run_cli("net", "down", timeout=300)
    assert cleanup.leftovers() == {}
    # net verify measures each link's MTU (its goodput rows cannot reach 100 Gbit/s here: not asserted)
    verify = run_cli("net", "verify", str(f), "--json", "--seconds", "1", "--pings", "5", timeout=600)
    rows = [c for c in json.loads(verify.stdout)["checks"] if c["kind"] == "link_mtu"]
    assert {r["subject"]: (r["measured"], r["status"]) for r in rows} == {
        "a<->b": (9000, "pass"), "b<->c": (1400, "pass")}, rows
    assert cleanup.leftovers() == {}


def test_a_link_has_one_mtu(tmp_path):
    bad = dict(SPEC, links=[{"a": "a", "b": "b", "forward": {"mtu": 9000}}, SPEC["links"][1]])
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    r = run_cli("net", "up", str(f), "--dry-run", timeout=120)
    assert r.returncode == 2 and "links[0].reverse.mtu" in r.stderr, r.stderr
