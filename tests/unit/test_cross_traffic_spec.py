"""Cross traffic as a spec section: validation naming the field, the summary and trace built from
its records, and a trial marked unfaithful when a flow the spec asked for did not run."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from testbed.collect.trace import build_trace, validate_trace
from testbed.experiments.spec import parse_experiment
from testbed.experiments.trial import faithfulness
from testbed.network.cross_gen import _windows
from testbed.network.cross_traffic import CrossFlow, format_summary, parse_cross_traffic, summarize
from traffic_control.errors import ValidationError

DCS = ["a", "b", "c"]


@pytest.mark.parametrize(("flow", "field", "words"), [
    ({"from": "a", "to": "a", "pattern": "constant"}, "cross_traffic[0].to", "both 'a'"),
    ({"from": "a", "to": "z", "pattern": "constant"}, "cross_traffic[0].to", "no DC named 'z'"),
    ({"to": "b", "pattern": "constant"}, "cross_traffic[0].from", "missing"),
    ({"from": "a", "to": "b", "pattern": "bulk"}, "cross_traffic[0].pattern", "constant"),
    ({"from": "a", "to": "b", "pattern": "constant", "protocol": "udp"}, "cross_traffic[0].rate", "UDP"),
    ({"from": "a", "to": "b", "pattern": "constant", "rate": "-1Mbit"}, "cross_traffic[0].rate", "> 0"),
    ({"from": "a", "to": "b", "pattern": "on_off", "on_time": "1s"}, "cross_traffic[0].off_time", "both on_time and off_time"),
    ({"from": "a", "to": "b", "pattern": "constant", "on_time": "1s"}, "cross_traffic[0].on_time", "on_off"),
    ({"from": "a", "to": "b", "pattern": "short_flows", "size": "1KB"}, "cross_traffic[0].arrival_rate", "needs"),
    ({"from": "a", "to": "b", "pattern": "short_flows", "size": "1KB", "arrival_rate": 2, "rate": "1Mbit"},
     "cross_traffic[0].rate", "no rate"),
    ({"from": "a", "to": "b", "pattern": "short_flows", "size": "1KB", "arrival_rate": 2, "protocol": "udp"},
     "cross_traffic[0].protocol", "TCP"),
    ({"from": "a", "to": "b", "pattern": "constant", "size": "1KB"}, "cross_traffic[0].size", "short_flows"),
    ({"from": "a", "to": "b", "pattern": "constant", "burst": 3}, "cross_traffic[0].burst", ""),
])
def test_a_bad_flow_names_its_field(flow, field, words):
    with pytest.raises(ValidationError) as e:
        parse_cross_traffic([flow], DCS)
    assert e.value.field == field, str(e.value)
    assert words in str(e.value)


def test_labels_default_to_the_index_and_must_be_unique():
    flows = parse_cross_traffic([{"from": "a", "to": "b", "pattern": "constant"},
                                 {"from": "b", "to": "c", "pattern": "on_off", "on_time": "2s", "off_time": "3s",
                                  "rate": "10Mbit"}], DCS)
    assert [f.label for f in flows] == ["x0", "x1"]
    assert flows[1].offered_bps == pytest.approx(4e6)  # 10 Mbit/s for 2 of every 5 s
    assert flows[0].offered_bps is None  # greedy TCP
    with pytest.raises(ValidationError) as e:
        parse_cross_traffic([{"from": "a", "to": "b", "pattern": "constant", "label": "bg"},
                             {"from": "b", "to": "a", "pattern": "constant", "label": "bg"}], DCS)
    assert e.value.field == "cross_traffic[1].label"


def _experiment(cross):
    return {"name": "x", "topology": "three_dc_triangle", "training": {"workload": {"name": "digits"}},
            "cross_traffic": cross}


def test_an_experiment_carries_its_cross_traffic_checked_against_its_topology():
    spec = parse_experiment(_experiment([{"from": "east", "to": "west", "pattern": "short_flows",
                                          "size": "100KB", "arrival_rate": 2}]))
    assert [(f.src, f.dst, f.pattern) for f in spec.cross_traffic] == [("east", "west", "short_flows")]
    with pytest.raises(ValidationError) as e:
        parse_experiment(_experiment([{"from": "east", "to": "mars", "pattern": "constant"}]))
    assert e.value.field == "cross_traffic[0].to" and "use one of" in str(e.value)
    with pytest.raises(ValidationError) as e:
        parse_experiment(_experiment([{"from": "east", "to": "west", "pattern": "constant", "protocol": "udp"}]))
    assert e.value.field == "cross_traffic[0].rate"


def test_on_off_windows_follow_the_spec():
    flow = {"pattern": "on_off", "on_s": 1.0, "off_s": 2.0, "start_s": 0.5, "duration_s": 7.0}
    assert list(_windows(flow, 100.0, threading.Event())) == [(100.5, 101.5), (103.5, 104.5), (106.5, 107.5)]
    flow = {"pattern": "constant", "start_s": 1.0}
    assert list(_windows(flow, 100.0, threading.Event())) == [(101.0, float("inf"))]


def _records():
    s = 10**18
    ms = 10**6
    return [
        {"ts": s, "kind": "state", "flow": "x0", "on": True, "node": "a-xt"},
        {"ts": s + 500 * ms, "kind": "rx", "flow": "x0", "bytes": 500_000, "node": "b-xt"},
        {"ts": s + 1000 * ms, "kind": "rx", "flow": "x0", "bytes": 1_000_000, "node": "b-xt"},
        {"ts": s + 2000 * ms, "kind": "state", "flow": "x0", "on": False, "node": "a-xt"},
        {"ts": s, "kind": "state", "flow": "x1", "on": True, "node": "b-xt"},
        {"ts": s + 100 * ms, "kind": "short", "flow": "x1", "n": 1, "start": s, "bytes": 1000, "fct_s": 0.1,
         "node": "b-xt"},
        {"ts": s + 150 * ms, "kind": "short", "flow": "x1", "n": 2, "start": s + 50 * ms, "bytes": 1000,
         "fct_s": 0.1, "node": "b-xt"},
        {"ts": s + 160 * ms, "kind": "error", "flow": "x1", "n": 3, "error": "ConnectionRefusedError", "node": "b-xt"},
        {"ts": s + 1000 * ms, "kind": "state", "flow": "x1", "on": False, "started": 3, "skipped": 1,
         "node": "b-xt"},
    ]


def test_summary_and_trace_from_records():
    flows = [CrossFlow("x0", "a", "b", "constant", rate_bps=4e6),
             CrossFlow("x1", "b", "a", "short_flows", size_bytes=1000, arrival_rate=2.0)]
    summary = summarize(flows, _records(), 10**18)
    x0, x1 = summary["flows"]
    assert x0["active_s"] == 2.0 and x0["goodput_bps"] == pytest.approx(4e6)
    assert x1["short"] == {"started": 3, "completed": 2, "skipped": 1, "fct_p50_s": 0.1, "fct_p99_s": 0.1,
                           "fct_max_s": 0.1}
    assert summary["errors"] and "x1: 1 error(s)" in summary["errors"][0]
    text = format_summary(summary)
    assert "4.00 Mbit/s" in text and "2/3" in text and "1 skipped" in text
    # a trial whose cross traffic failed is not the network its figures assume
    assert any("cross traffic" in r for r in faithfulness({"cross_traffic": summary}))
    assert faithfulness({"cross_traffic": {"flows": [], "errors": []}}) == []

    trace = build_trace([], cross=_records())
    assert validate_trace(trace) == []
    ev = trace["traceEvents"]
    rate = [e for e in ev if e.get("name") == "cross x0 delivered"]
    assert [e["args"]["Mbit_s"] for e in rate] == [pytest.approx(8.0)]  # 500 kB in 0.5 s
    slices = [e for e in ev if e.get("ph") == "X"]
    assert len(slices) == 2 and len({e["tid"] for e in slices}) == 2  # overlapping flows: two lanes


def test_cli_refuses_a_bad_file_with_exit_2(tmp_path: Path):
    bad = tmp_path / "cross.yaml"
    bad.write_text("cross_traffic:\n  - {from: a, to: b, pattern: on_off, on_time: 1s}\n")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "net", "cross", str(bad)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "cross_traffic[0].off_time" in r.stderr
    yaml_trap = tmp_path / "on.yaml"  # YAML 1.1: a bare on/off key is a boolean
    yaml_trap.write_text("cross_traffic:\n  - {from: a, to: b, pattern: on_off, on: 1s, off: 2s}\n")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "net", "cross", str(yaml_trap)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "on_time" in r.stderr, r.stderr
    extra = tmp_path / "extra.yaml"
    extra.write_text("cross_traffic: []\nflows: []\n")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "net", "cross", str(extra)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "flows" in r.stderr
