"""Emulate mode across servers: ``testbed net up TOPOLOGY --cluster FILE`` as a user runs it.

The launcher is this (root) namespace, the other server a stand-in reached over SSH only
(tests/cluster/standins.py).  Every command is the CLI in its own process; what runs on the stand-in runs
there through ssh (``testbed net exec`` in its checkout), never by entering its namespaces from here.
"""

from __future__ import annotations

import json
import statistics
import subprocess

import pytest

from tests.cluster.standins import (
    LINE,
    PLACEMENT,
    kill_cli_when,
    local_namespaces,
    min_rtt_ms,
    on_s2,
    running,
    s2_state,
    s2_testbed,
    write,
)
from tests.conftest import REPO, run_cli
from traffic_control.shape import tcp_payload_fraction

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    yield from running(tmp_path_factory.mktemp("emulate"), 1)


def iperf_bps(standins, sender_on_s2: bool, sender: str, port: int) -> float:
    srv = s2_testbed(standins, "net", "exec", "b-h1", "--", "iperf3", "-s", "-1", "-D", "-p", str(port))
    assert srv.returncode == 0, srv.stderr
    client = ["net", "exec", sender, "--", "iperf3", "-c", "10.2.0.1", "-p", str(port), "-t", "4", "-O", "1", "-J"]
    r = s2_testbed(standins, *client, timeout=60) if sender_on_s2 else run_cli(*client, timeout=60)
    assert r.returncode == 0, r.stdout[-500:] + r.stderr
    return json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"]


def test_up_across_two_servers_delays_goodput_and_down(standins, tmp_path):
    topo = write(tmp_path, LINE, "line3.yaml")
    cluster = write(tmp_path, standins.cluster(placement=PLACEMENT))
    r = run_cli("net", "up", str(topo), "--cluster", str(cluster), "--json", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["placement"]["assignment"] == PLACEMENT and rep["placement"]["tunnels"] == [["a", "b"]]
    assert rep["servers"]["s1"]["dcs"] == ["a"] and rep["servers"]["s2"]["dcs"] == ["b", "c"]
    assert rep["servers"]["s1"]["impairment"] == rep["servers"]["s2"]["impairment"] != "none"
    clock = rep["servers"]["s2"]["clock"]  # the stand-in shares this machine's clock: the truth is 0
    assert abs(clock["offset_ns"]) <= max(clock["bound_ns"], 50_000) and clock["bound_ns"] <= 1e6, clock
    try:
        # each server holds its own DCs, nothing else
        assert local_namespaces() == ["tb-a-h1", "tb-a-r", "tb-a-sw"]
        s2_ns = on_s2(standins, "ip netns list").stdout
        assert "tb-b-r" in s2_ns and "tb-c-h1" in s2_ns and "tb-a-" not in s2_ns
        # delays across the server boundary: a -> b (one tunnel) and a -> c (tunnel, then b-c on s2)
        for dst, rtt in (("10.2.0.1", 10.0), ("10.3.0.1", 20.0)):  # 5 ms one way per link
            p = run_cli("net", "exec", "a-h1", "--", "ping", "-c", "20", "-i", "0.05", dst, timeout=60)
            assert " 0% packet loss" in p.stdout, p.stdout
            assert rtt <= min_rtt_ms(p.stdout) <= rtt + 3.0, (dst, p.stdout[-200:])
        back = s2_testbed(standins, "net", "exec", "c-h1", "--", "ping", "-c", "20", "-i", "0.05", "10.1.0.1")
        assert " 0% packet loss" in back.stdout and 20.0 <= min_rtt_ms(back.stdout) <= 23.0, back.stdout
        # goodput: the tunnelled link a->b beside the same-server link c->b at the same shape, alternated
        tunnel, local = [], []
        for k in range(3):
            tunnel.append(iperf_bps(standins, False, "a-h1", 5301 + 2 * k))
            local.append(iperf_bps(standins, True, "c-h1", 5302 + 2 * k))
        ratio = statistics.median(tunnel) / statistics.median(local)
        ideal = 50e6 * tcp_payload_fraction()
        print(f"MEASURED tunnel a->b {[round(x / 1e6, 2) for x in tunnel]} Mbit/s, same-server c->b "
              f"{[round(x / 1e6, 2) for x in local]} Mbit/s, ratio of medians {ratio:.3f} (bar 0.95); "
              f"ideal {ideal / 1e6:.2f}")
        assert ratio >= 0.95, (tunnel, local)
        assert statistics.median(local) >= 0.8 * ideal
        # a tunnelled link is changed from the launcher, not from one end: said, not half done
        st = run_cli("net", "set", "a", "b", "--delay", "7ms")
        assert st.returncode == 2 and "crosses servers" in st.stderr and "--cluster" in st.stderr, st.stderr
    finally:
        d = run_cli("net", "down", "--cluster", str(cluster), timeout=120)
    assert d.returncode == 0, d.stderr
    assert local_namespaces() == []
    assert s2_state(standins) == {}


def test_a_tunnel_that_does_not_fit_the_servers_mtu_is_refused_and_nothing_stays(standins, tmp_path):
    big = dict(LINE, links=[dict(LINE["links"][0], mtu=9000), LINE["links"][1]])
    r = run_cli("net", "up", str(write(tmp_path, big, "big.yaml")), "--cluster",
                str(write(tmp_path, standins.cluster(placement=PLACEMENT))), timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "links[0].mtu" in r.stderr and "VXLAN" in r.stderr and "mtu: 8950" in r.stderr, r.stderr
    # found on s2 while the launcher built its own part: that part is taken down again
    assert "removing the parts built so far" in r.stderr, r.stderr
    assert local_namespaces() == [] and s2_state(standins) == {}


def test_a_server_with_other_code_is_refused_before_anything_is_built(standins, tmp_path):
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", str(REPO), str(other)], check=True)
    subprocess.run(["git", "-C", str(other), "checkout", "-q", "HEAD~1"], check=True)
    spec = standins.cluster(placement=PLACEMENT)
    spec["servers"][1]["checkout"] = str(other)
    r = run_cli("net", "up", str(write(tmp_path, LINE, "line3.yaml")), "--cluster", str(write(tmp_path, spec)),
                timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "servers[1].checkout" in r.stderr and "same commit" in r.stderr, r.stderr
    assert local_namespaces() == [] and s2_state(standins) == {}
    spec["servers"][1]["checkout"] = str(tmp_path / "nowhere")
    r = run_cli("net", "up", str(write(tmp_path, LINE, "line3.yaml")), "--cluster", str(write(tmp_path, spec)),
                timeout=300)
    assert r.returncode == 2 and "no testbed checkout" in r.stderr, r.stderr
    # `cluster check` says the same as a problem (exit 1)
    spec["servers"][1]["checkout"] = str(other)
    c = run_cli("cluster", "check", str(write(tmp_path, spec)), timeout=120)
    assert c.returncode == 1 and "same commit" in c.stdout, c.stdout


def test_a_server_that_cannot_be_reached_fails_the_build_and_leaves_nothing(standins, tmp_path):
    spec = standins.cluster(placement={"a": "s1", "b": "s2", "c": "gone"}, connect_timeout=2)
    spec["servers"].append({"name": "gone", "address": "10.231.0.99"})
    r = run_cli("net", "up", str(write(tmp_path, LINE, "line3.yaml")), "--cluster", str(write(tmp_path, spec)),
                timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "server gone" in r.stderr and "10.231.0.99" in r.stderr, r.stderr
    # found by the checkout check over ssh, before any server built anything
    assert "building" not in r.stderr, r.stderr
    assert local_namespaces() == [] and s2_state(standins) == {}


def test_clean_after_the_launcher_was_killed_mid_build_leaves_nothing_anywhere(standins, tmp_path):
    """SIGKILL of `net up --cluster` once the stand-in's part is building; one `testbed clean --cluster` (no
    state of the launcher's needed) then removes every part."""
    import time

    topo = write(tmp_path, LINE, "line3.yaml")
    cluster = write(tmp_path, standins.cluster(placement=PLACEMENT))
    kill_cli_when(standins, ["net", "up", str(topo), "--cluster", str(cluster)], "ip netns list", "tb-",
                  "the stand-in's part never started", timeout=120)
    # the orphaned remote build may still be running (ssh does not end it): clean ends it first (it carries
    # the owner mark), then removes its objects, so one clean leaves nothing, whatever the build had reached
    r = run_cli("clean", "--cluster", str(cluster), timeout=180)
    assert r.returncode == 0, r.stderr
    time.sleep(2.0)  # anything still creating objects would show now
    assert s2_state(standins) == {} and local_namespaces() == []
    assert "part-up" not in on_s2(standins, "ps ax").stdout


def shown(standins, on_s2_: bool) -> dict:
    r = s2_testbed(standins, "net", "show", "--json") if on_s2_ else run_cli("net", "show", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_net_set_across_servers_changes_each_direction_where_it_is_shaped(standins, tmp_path):
    """``net set A B --cluster``: a->b changes on the launcher, b->a on the stand-in, and the stand-in's b->c
    queue follows the longer a<->c round trip; an invalid change or a link no server shapes is refused with
    nothing changed; --down and --up cut and restore the tunnelled link."""
    topo = write(tmp_path, LINE, "line3.yaml")
    cluster = str(write(tmp_path, standins.cluster(placement=PLACEMENT)))
    r = run_cli("net", "up", str(topo), "--cluster", cluster, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

    def rtt(src_on_s2: bool, node: str, dst: str, count: int = 20) -> str:
        argv = ["net", "exec", node, "--", "ping", "-c", str(count), "-i", "0.05", "-W", "1", dst]
        return (s2_testbed(standins, *argv, timeout=60) if src_on_s2 else run_cli(*argv, timeout=60)).stdout

    try:
        assert 10.0 <= min_rtt_ms(rtt(False, "a-h1", "10.2.0.1")) <= 13.0
        before = shown(standins, True)["state"]["links"]["b->c"]["queue_rtt_s"]
        st = run_cli("net", "set", "a", "b", "--delay", "12ms", "--rate", "20Mbit", "--cluster", cluster, timeout=120)
        assert st.returncode == 0, st.stdout + st.stderr
        assert "a->b (s1): 20Mbit" in st.stdout and "b->a (s2): 20Mbit" in st.stdout, st.stdout
        assert "delay 12ms" in st.stdout, st.stdout
        # both directions, each on its own server: 2 x 12 ms over the tunnel, 2 x (12 + 5) ms to c
        m = min_rtt_ms(rtt(False, "a-h1", "10.2.0.1"))
        back = min_rtt_ms(rtt(True, "c-h1", "10.1.0.1"))
        print(f"MEASURED net set --cluster a-b delay 5 -> 12 ms: a-h1 -> b-h1 min RTT {m:.2f} ms (spec 24), "
              f"c-h1 -> a-h1 {back:.2f} ms (spec 34)")
        assert 24.0 <= m <= 27.0 and 34.0 <= back <= 37.0, (m, back)
        mine, theirs = shown(standins, False), shown(standins, True)
        assert mine["links"]["a->b"]["tc"]["shape"]["rate_bps"] == pytest.approx(20e6)
        assert theirs["links"]["b->a"]["tc"]["shape"]["rate_bps"] == pytest.approx(20e6)
        # the stand-in's b->c queue is sized for the a<->c flows' new round trip (20 -> 34 ms)
        after = theirs["state"]["links"]["b->c"]["queue_rtt_s"]
        assert before == pytest.approx(0.020) and after == pytest.approx(0.034), (before, after)
        assert theirs["state"]["remote_delays"] == [["a", "b", 0.012]], theirs["state"]["remote_delays"]
        # refused, naming the flag and the server, before anything is touched
        bad = run_cli("net", "set", "a", "b", "--jitter", "30ms", "--cluster", cluster, timeout=120)
        assert bad.returncode == 2 and "--jitter" in bad.stderr and "s1" in bad.stderr, bad.stderr
        far = run_cli("net", "set", "a", "c", "--delay", "1ms", "--cluster", cluster, timeout=120)
        assert far.returncode == 2 and "no server shapes a->c" in far.stderr, far.stderr
        assert shown(standins, True)["links"]["b->a"]["spec"].get("jitter") is None
        # down: the tunnelled link carries nothing; up: it does again
        dn = run_cli("net", "set", "a", "b", "--down", "--cluster", cluster, timeout=120)
        assert dn.returncode == 0, dn.stderr
        assert " 100% packet loss" in rtt(False, "a-h1", "10.2.0.1", count=5)
        up = run_cli("net", "set", "a", "b", "--up", "--cluster", cluster, timeout=120)
        assert up.returncode == 0, up.stderr
        assert 24.0 <= min_rtt_ms(rtt(False, "a-h1", "10.2.0.1")) <= 27.0
        assert 34.0 <= min_rtt_ms(rtt(True, "c-h1", "10.1.0.1")) <= 37.0
        whole_network_shown(standins, tmp_path, cluster)
    finally:
        d = run_cli("net", "down", "--cluster", cluster, timeout=120)
    assert d.returncode == 0, d.stderr
    assert local_namespaces() == [] and s2_state(standins) == {}


def whole_network_shown(standins, tmp_path, cluster: str) -> None:
    """``net show --cluster`` from the launcher: every direction with the server that shapes it, as the
    servers' kernels report it; a server that does not answer is named and its directions are unreported."""
    r = run_cli("net", "show", "--cluster", cluster, "--json", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["mode"] == "emulate" and out["unreported"] == []
    assert {k: v["server"] for k, v in out["links"].items()} == {"a->b": "s1", "b->a": "s2", "b->c": "s2",
                                                                 "c->b": "s2"}
    assert out["links"]["a->b"]["tc"]["shape"]["rate_bps"] == pytest.approx(20e6)
    assert out["links"]["b->a"]["tc"]["shape"]["rate_bps"] == pytest.approx(20e6)
    assert out["servers"]["s2"]["dcs"] == ["b", "c"] and out["servers"]["s1"]["tunnels"] == 1
    assert {h["server"] for h in out["impairment_health"]} == {"s1", "s2"}
    text = run_cli("net", "show", "--cluster", cluster, timeout=120)
    assert text.returncode == 0 and "s1 (this machine): DCs a" in text.stdout, text.stdout + text.stderr
    assert "a->b         (s1) 20Mbit, delay 12ms" in text.stdout and "b->c         (s2) 50Mbit" in text.stdout, text.stdout
    # s2 unreachable (a port nothing listens on): named, its three directions unreported, exit 1
    spec = standins.cluster(placement=PLACEMENT, connect_timeout=2)
    spec["servers"][1]["port"] = 1
    r = run_cli("net", "show", "--cluster", str(write(tmp_path, spec, "wrong-port.yaml")), "--json", timeout=120)
    out = json.loads(r.stdout)
    assert r.returncode == 1 and not out["ok"] and out["servers"]["s2"]["ok"] is False, r.stdout
    assert "ssh" in out["servers"]["s2"]["error"] and out["unreported"] == ["b->a", "b->c", "c->b"], out


def test_down_reports_a_server_it_could_not_reach(standins, tmp_path):
    """Last in this module: it kills the stand-in's sshd (after its part is up)."""
    topo = write(tmp_path, LINE, "line3.yaml")
    cluster = write(tmp_path, standins.cluster(placement=PLACEMENT, connect_timeout=2))
    assert run_cli("net", "up", str(topo), "--cluster", str(cluster), timeout=300).returncode == 0
    assert s2_state(standins) != {}
    # the stand-in's testbed goes first (as a server would be cleaned by its operator), then its sshd
    assert s2_testbed(standins, "net", "down").returncode == 0
    standins.kill_sshd("s2")
    d = run_cli("net", "down", "--cluster", str(cluster), timeout=120)
    assert d.returncode == 1
    assert "s2: NOT cleaned" in d.stderr and "s1: cleaned" in d.stderr, d.stderr
    assert local_namespaces() == []

