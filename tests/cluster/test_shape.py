"""Shape mode across a launcher and a stand-in server, as a user runs it: the servers are the DCs' hosts.

A 3-DC topology on 2 servers: a (the launcher) and c (the stand-in) have hosts, b has none and relays, so
each server's one shaper stands for a two-hop path (rate of the slowest hop, delays summed; c->a slower than
a->c).  Everything is measured from the servers' own namespaces, where trainers run, the stand-in's over
ssh only.  The side-by-side test shows why the shaper sits in a namespace of its own: the same hold in the
sending namespace (TCP Small Queues) gets a fraction of the rate.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.cluster.standins import (
    LAUNCHER_IF,
    SUBNET,
    local_namespaces,
    min_rtt_ms,
    on_s2,
    running,
    s2_state,
    s2_testbed,
    verify_failures,
    write,
)
from tests.conftest import run_cli

pytestmark = [pytest.mark.root, pytest.mark.slow]

RELAY = {"name": "relay3", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 0}, {"name": "c", "hosts": 1}],
         "links": [{"a": "a", "b": "b", "rate": "40Mbit", "delay": "5ms"},
                   {"a": "b", "b": "c", "forward": {"rate": "30Mbit", "delay": "3ms"},
                    "reverse": {"rate": "20Mbit", "delay": "3ms"}}]}
S2 = f"{SUBNET}.2"


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    yield from running(tmp_path_factory.mktemp("shape"), 1)


def files(standins, tmp_path, topo: dict = RELAY, **cluster: object) -> tuple[str, str]:
    return (str(write(tmp_path, topo, "topo.yaml")),
            str(write(tmp_path, standins.cluster(mode="shape", **cluster))))


def launcher_shape_objects() -> list[str]:
    from testbed.cluster import shaper

    return shaper.root_leftovers() + [n for n in local_namespaces() if n == "tb-shape"]


def nothing_left(standins) -> None:
    assert launcher_shape_objects() == []
    assert local_namespaces() == []
    assert s2_state(standins) == {}
    ps = on_s2(standins, "ps ax -o args").stdout
    assert "until-eof" not in ps and "iperf3" not in ps and "traffic_control.userspace" not in ps, ps


def ping_ms(argv_prefix: list[str] | None = None, target: str = S2, count: int = 10) -> float:
    r = subprocess.run([*(argv_prefix or []), "ping", "-n", "-c", str(count), "-i", "0.05", target],
                       capture_output=True, text=True, timeout=60)
    return min_rtt_ms(r.stdout)


def test_verify_passes_on_a_relayed_path_in_both_directions(standins, tmp_path):
    topo, cluster = files(standins, tmp_path)
    r = run_cli("net", "verify", topo, "--cluster", cluster, "--seconds", "2", "--pings", "10", "--json",
                timeout=600)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["ok"], verify_failures(r, out)
    rows = {(c["kind"], c["subject"]): c for c in out["checks"]}
    assert rows[("shaper", "a->c")]["measured"] == 30e6 and rows[("shaper", "c->a")]["measured"] == 20e6
    rtt = rows[("pair_rtt", "a<->c")]
    assert rtt["expected"] == pytest.approx(0.016) and rtt["extra"]["path"] == ["a", "b", "c"]
    for subject, rate in (("a->c", 30e6), ("c->a", 20e6)):
        row = rows[("pair_goodput", subject)]
        assert row["status"] == "pass" and row["extra"]["rate_bps"] == rate, row
    assert out["shaping"]["s2"]["egress"][0]["shape"]["delay_s"] == pytest.approx(0.008)
    nothing_left(standins)
    # --delays: one-way delay per direction, server to server, the measured clock offset taken out
    r = run_cli("net", "verify", topo, "--cluster", cluster, "--delays", "--seconds", "1", "--pings", "5", "--json",
                timeout=600)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["ok"], verify_failures(r, out)
    means = {c["subject"]: c for c in out["checks"] if c["kind"] == "delay_mean"}
    assert set(means) == {"a->c", "c->a"} and all(c["status"] == "pass" for c in means.values()), means
    assert means["a->c"]["expected"] == pytest.approx(0.008)
    assert means["a->c"]["extra"]["clock_correction_s"] == pytest.approx(0, abs=0.002)
    nothing_left(standins)
    # --quick: the self-test a trial runs first (shapers read back, RTT, a UDP rate train each way)
    r = run_cli("net", "verify", topo, "--cluster", cluster, "--quick", "--json", timeout=600)
    out = json.loads(r.stdout)
    assert r.returncode == 0 and out["ok"], verify_failures(r, out)
    rates = {c["subject"]: c for c in out["checks"] if c["kind"] == "link_rate"}
    assert set(rates) == {"a->c", "c->a"} and all(c["status"] == "pass" for c in rates.values()), rates
    nothing_left(standins)


def test_net_up_stays_up_probed_from_both_servers_then_down(standins, tmp_path):
    topo, cluster = files(standins, tmp_path)
    before = ping_ms()
    up = run_cli("net", "up", topo, "--cluster", cluster, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert "a->c (s2 via b): 30Mbit, delay 8ms" in up.stderr, up.stderr
        # the network outlives the command: probed from this (another) process and from the stand-in
        assert 16 <= ping_ms() <= 18.5
        r = on_s2(standins, f"ping -n -c 10 -i 0.05 {SUBNET}.1")
        assert 16 <= min_rtt_ms(r.stdout) <= 18.5, r.stdout
        # only this machine's own traffic to the other DC is shaped: the stand-in's namespace network itself
        # (the bridge's other side) is reached directly
        ex = s2_testbed(standins, "net", "exec", "s2", "--", "sh", "-c", "echo $TESTBED_NODE")
        assert ex.returncode == 0 and ex.stdout.strip() == "s2", ex.stderr
        bad = s2_testbed(standins, "net", "exec", "c-h1", "--", "true")
        assert bad.returncode == 2 and "use: testbed net exec s2" in bad.stderr, bad.stderr
        assert launcher_shape_objects()  # rule, table, FORWARD accept, namespace
        # net show on the stand-in (its shaper), and of the whole network from the launcher
        sh = s2_testbed(standins, "net", "show")
        assert sh.returncode == 0 and "shape mode: server s2 (DC c)" in sh.stdout, sh.stdout + sh.stderr
        assert "c->a         (to s1 via b) 20Mbit, delay 8ms" in sh.stdout, sh.stdout
        whole = run_cli("net", "show", "--cluster", cluster, "--json", timeout=120)
        assert whole.returncode == 0, whole.stdout + whole.stderr
        out = json.loads(whole.stdout)
        assert out["ok"] and out["mode"] == "shape" and out["unreported"] == []
        assert {k: (v["server"], v["tc"]["shape"]["rate_bps"]) for k, v in out["links"].items()} == {
            "a->c": ("s1", 30e6), "c->a": ("s2", 20e6)}
    finally:
        # each server on its own, the launcher by a plain `testbed clean` (what a user runs after a crash)
        s2_down = s2_testbed(standins, "net", "down")
        clean = run_cli("clean", timeout=120)
    assert s2_down.returncode == 0 and clean.returncode == 0, s2_down.stderr + clean.stderr
    nothing_left(standins)
    assert ping_ms() < max(2.0, 3 * before)


def test_errors_leave_nothing_behind(standins, tmp_path):
    three = dict(RELAY, dcs=[dict(d, hosts=1) for d in RELAY["dcs"]])
    topo, cluster = files(standins, tmp_path, three)
    r = run_cli("net", "up", topo, "--cluster", cluster, timeout=120)
    assert r.returncode == 2 and "servers: shape mode needs one server per DC with hosts: 3" in r.stderr, r.stderr
    topo, cluster = files(standins, tmp_path, placement={"a": "s1", "c": "s1"})
    r = run_cli("net", "up", topo, "--cluster", cluster, timeout=120)
    assert r.returncode == 2 and "placement.c" in r.stderr and "already is DC a" in r.stderr, r.stderr
    lan = dict(RELAY, dcs=[{"name": "a", "hosts": 1, "lan": {"delay": "1ms"}}, *RELAY["dcs"][1:]])
    topo, cluster = files(standins, tmp_path, lan)
    r = run_cli("net", "up", topo, "--cluster", cluster, timeout=120)
    assert r.returncode == 2 and "dcs[0].lan" in r.stderr, r.stderr
    # a server that cannot be reached: a clear error naming it, and the launcher cleaned
    topo, cluster = files(standins, tmp_path)
    spec = standins.cluster(mode="shape")
    spec["servers"][1]["address"] = f"{SUBNET}.77"
    r = run_cli("net", "up", topo, "--cluster", str(write(tmp_path, spec)), timeout=120)
    assert r.returncode != 0 and "s2" in r.stderr, r.stderr
    nothing_left(standins)


def test_a_hold_in_the_senders_own_namespace_is_throttled_the_shaper_is_not(standins, tmp_path):
    """Side by side, one run: 50 Mbit/s and 20 ms one way (a->c only), held by the userspace backend
    (a) through shape mode's shaper, (b) on the launcher's own egress interface, in the sending namespace."""
    from testbed.network import impairment as uimp
    from traffic_control import netlink as tcnl
    from traffic_control.shape import LinkShape
    from traffic_control.userspace import UserspaceImpairment

    two = {"name": "two", "dcs": [{"name": "a", "hosts": 1}, {"name": "c", "hosts": 1}],
           "links": [{"a": "a", "b": "c", "forward": {"rate": "50Mbit", "delay": "20ms"}, "reverse": {}}]}

    def goodput() -> float:
        srv = subprocess.Popen(["ssh", *standins.ssh_options(), f"root@{S2}", "exec iperf3 -s -1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(50):
                out = subprocess.run(["iperf3", "-c", S2, "-t", "3", "-O", "1", "-J"], capture_output=True,
                                     text=True, timeout=60).stdout
                if "Connection refused" not in out:
                    break
                time.sleep(0.2)
            return json.loads(out)["end"]["sum_received"]["bits_per_second"] / (50e6 * 1448 / 1514)
        finally:
            srv.wait(timeout=30)

    topo, cluster = files(standins, tmp_path, two)
    up = run_cli("net", "up", topo, "--cluster", cluster, timeout=300)
    assert up.returncode == 0, up.stderr[-2000:]
    try:
        assert 20 <= ping_ms() <= 22.5
        through_shaper = goodput()
    finally:
        assert run_cli("net", "down", "--cluster", cluster, timeout=120).returncode == 0
    shape = LinkShape(rate_bps=50e6, delay_s=0.02, queue_rtt_s=0.02)
    tcnl.apply(LAUNCHER_IF, shape, netem=False)
    imp = UserspaceImpairment.start(None, LAUNCHER_IF, uimp.to_impairment_shape(shape),
                                    state_dir=str(tmp_path / "held-here"))
    try:
        assert 20 <= ping_ms() <= 22.5  # the same delay, held in the namespace the flow starts in
        held_here = goodput()
    finally:
        imp.stop()
        tcnl.clear(LAUNCHER_IF)
    print(f"\ngoodput/ideal, 50 Mbit/s 20 ms: through the shaper x{through_shaper:.3f}, "
          f"held in the sender's namespace x{held_here:.3f}")
    assert through_shaper >= 0.95
    assert held_here < 0.7  # TCP Small Queues: the held packets stay charged to the socket
    nothing_left(standins)


def test_net_set_recomposes_every_path_over_the_link_on_both_servers(standins, tmp_path):
    """relay3 in shape mode (a on the launcher, c on the stand-in, b relays): a-b's delay 5 -> 12 ms moves the
    a<->c round trip 16 -> 30 ms, measured from both servers; b->c alone to 10 Mbit/s changes the launcher's
    a->c shaper only; a change the paths or the backend cannot take and a link that is not there are refused
    (exit 2) with nothing changed."""
    topo, cluster = files(standins, tmp_path)
    up = run_cli("net", "up", topo, "--cluster", cluster, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert 16 <= ping_ms() <= 18.5
        st = run_cli("net", "set", "a", "b", "--delay", "12ms", "--cluster", cluster, timeout=120)
        assert st.returncode == 0, st.stdout + st.stderr
        assert "a->c (s1 via b): 30Mbit, delay 15ms" in st.stdout, st.stdout
        assert "c->a (s2 via b): 20Mbit, delay 15ms" in st.stdout, st.stdout
        here = ping_ms(count=20)
        there = min_rtt_ms(on_s2(standins, f"ping -n -c 20 -i 0.05 {SUBNET}.1").stdout)
        print(f"\nMEASURED net set a-b 5 -> 12 ms in shape mode: a<->c min RTT {here:.2f} ms from the launcher, "
              f"{there:.2f} ms from the stand-in (spec 30)")
        assert 30 <= here <= 32.5 and 30 <= there <= 32.5, (here, there)
        one = run_cli("net", "set", "b", "c", "--one-way", "--rate", "10Mbit", "--cluster", cluster, timeout=120)
        assert one.returncode == 0 and "a->c (s1 via b): 10Mbit" in one.stdout and "c->a" not in one.stdout, \
            one.stdout + one.stderr
        shown = json.loads(run_cli("net", "show", "--cluster", cluster, "--json", timeout=120).stdout)
        assert {k: v["tc"]["shape"]["rate_bps"] for k, v in shown["links"].items()} == {"a->c": 10e6, "c->a": 20e6}
        before = shown["links"]
        for argv, words in ((["a", "b", "--duplicate", "1%"], "duplicat"), (["a", "c", "--delay", "1ms"], "no link a-c")):
            bad = run_cli("net", "set", *argv, "--cluster", cluster, timeout=120)
            assert bad.returncode == 2 and words in bad.stderr, (argv, bad.stderr)
        after = json.loads(run_cli("net", "show", "--cluster", cluster, "--json", timeout=120).stdout)["links"]
        assert {k: v["tc"]["shape"] for k, v in after.items()} == {k: v["tc"]["shape"] for k, v in before.items()}
        assert 30 <= ping_ms() <= 32.5
    finally:
        down = run_cli("net", "down", "--cluster", cluster, timeout=120)
    assert down.returncode == 0, down.stderr
    nothing_left(standins)


def loss_pct(ping_stdout: str) -> float:
    return float(ping_stdout.split("% packet loss")[0].rsplit(" ", 1)[-1])


def ping_loss_pct() -> float:
    r = subprocess.run(["ping", "-n", "-c", "20", "-i", "0.05", "-W", "1", S2], capture_output=True, text=True,
                       timeout=60)
    return loss_pct(r.stdout)


def test_a_link_down_cuts_every_path_over_it_on_both_servers_and_up_restores_it(standins, tmp_path):
    """relay3 in shape mode: a-b down cuts a->c (the launcher's shaper) and c->a (the stand-in's): every ping
    either way is lost, none leaks past the shaper by the servers' own network; a delay change made while it is
    down is taken; up restores both paths with the new delay.  The testbed's own ssh keeps working throughout
    (net show --cluster answers from both servers)."""
    topo, cluster = files(standins, tmp_path)
    up = run_cli("net", "up", topo, "--cluster", cluster, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        assert 16 <= ping_ms() <= 18.5
        dn = run_cli("net", "set", "a", "b", "--down", "--cluster", cluster, timeout=120)
        assert dn.returncode == 0, dn.stdout + dn.stderr
        assert "a->c (s1 via b): 30Mbit, delay 8ms" in dn.stdout and "DOWN" in dn.stdout, dn.stdout
        assert "c->a (s2 via b)" in dn.stdout, dn.stdout
        here, there = ping_loss_pct(), loss_pct(on_s2(standins, f"ping -n -c 20 -i 0.05 -W 1 {SUBNET}.1").stdout)
        print(f"\nMEASURED shape mode a-b down: ping a->c lost {here:g}% from the launcher, {there:g}% from the "
              "stand-in")
        assert here == 100.0 and there == 100.0, (here, there)
        shown = run_cli("net", "show", "--cluster", cluster, "--json", timeout=120)
        links = json.loads(shown.stdout)["links"]
        assert {k: v["link"]["admin_up"] for k, v in links.items()} == {"a->c": False, "c->a": False}, links
        st = run_cli("net", "set", "a", "b", "--delay", "8ms", "--cluster", cluster, timeout=120)
        assert st.returncode == 0 and "a->c (s1 via b): 30Mbit, delay 11ms" in st.stdout, st.stdout + st.stderr
        assert ping_loss_pct() == 100.0  # still cut
        back = run_cli("net", "set", "a", "b", "--up", "--cluster", cluster, timeout=120)
        assert back.returncode == 0 and "DOWN" not in back.stdout, back.stdout + back.stderr
        here = ping_ms(count=20)
        there = min_rtt_ms(on_s2(standins, f"ping -n -c 20 -i 0.05 {SUBNET}.1").stdout)
        print(f"MEASURED after up (a-b now 8 ms): a<->c min RTT {here:.2f} ms launcher, {there:.2f} ms stand-in "
              "(spec 22)")
        assert 22 <= here <= 24.5 and 22 <= there <= 24.5, (here, there)
    finally:
        down = run_cli("net", "down", "--cluster", cluster, timeout=120)
    assert down.returncode == 0, down.stderr
    nothing_left(standins)
