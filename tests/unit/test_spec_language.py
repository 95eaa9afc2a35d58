"""One convention for units and YAML across every spec (README "Units")."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from testbed.training.config import validate_training
from topologies.loader import parse_text, read_mapping
from topologies.model import from_dict
from traffic_control.errors import ValidationError
from traffic_control.units import AmbiguousUnit, parse_rate

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text,bps", [("1.5Gbps", 1.5e9), ("100mbps", 100e6), ("100Mbps", 100e6),
                                      ("512kbps", 512e3), ("10m", 10e6), ("8mb", 8e6), ("1000bps", 1000.0)])
def test_bps_words_are_bits_with_a_warning(text: str, bps: float) -> None:
    with pytest.warns(AmbiguousUnit) as w:
        assert parse_rate(text, "links[0].rate") == pytest.approx(bps)
    msg = str(w[0].message)
    assert msg.startswith("links[0].rate:") and "bits per second" in msg and "tc would read" in msg


@pytest.mark.parametrize("text", ["100Mbit", "1Gbit", "12.5MBps", "1KBps", 1e6, "250000"])
def test_unambiguous_spellings_do_not_warn(text: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_rate(text)


@pytest.mark.parametrize("text", ["100MB", "1GB", "64KB", "10B"])
def test_a_size_is_not_a_rate(text: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_rate(text, "wan.rate")
    assert e.value.field == "wan.rate" and "is a size" in e.value.problem and "bit" in e.value.fix


def _topo(**link: object) -> dict:
    return {"name": "t", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
            "links": [{"a": "a", "b": "b", "rate": "10Mbit", **link}]}


@pytest.mark.parametrize("value", [20, "20", " 20 ", 20.0, "1e2"])
def test_a_delay_without_unit_is_refused_quoted_or_not(value: object) -> None:
    with pytest.raises(ValidationError) as e:
        from_dict(_topo(delay=value))
    assert e.value.field == "links[0].delay" and "seconds" in e.value.problem


def test_small_unitless_delays_and_unit_strings_agree() -> None:
    a = from_dict(_topo(delay="0.02")).links[0].forward.delay_s
    b = from_dict(_topo(delay=0.02)).links[0].forward.delay_s
    c = from_dict(_topo(delay="20ms")).links[0].forward.delay_s
    assert a == b == pytest.approx(c)


def test_duplicate_and_unhashable_keys_are_errors(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("name: x\nlinks: []\nname: y\n")
    with pytest.raises(ValidationError) as e:
        read_mapping(tmp_path / "d.yaml")
    assert "line 3, column 1" in e.value.problem and "duplicate key 'name' (first at line 1)" in e.value.problem
    with pytest.raises(ValidationError) as e:
        parse_text("a:\n  b: 1\n  b: 2\n", "nested")
    assert "duplicate key 'b'" in e.value.problem
    with pytest.raises(ValidationError) as e:
        parse_text("? [a, b]\n: 1\n", "k")
    assert "plain value" in e.value.problem
    with pytest.raises(ValidationError) as e:
        parse_text('{"a": 1, "a": 2}', "j", as_json=True)
    assert "duplicate key 'a'" in e.value.problem
    assert parse_text("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\n") == {"a": {"b": 1}, "c": {"b": 1, "d": 2}}


def test_duplicate_key_exits_2_from_the_command_line(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("name: t\ndcs: [a, b]\nlinks: [{a: a, b: b, rate: 10Mbit}]\nlinks: []\n")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "topo", str(p)], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.returncode == 2 and "duplicate key 'links'" in r.stderr, r.stderr


def test_ambiguous_rate_warns_once_on_the_command_line(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("name: t\ndcs: [a, b]\nlinks: [{a: a, b: b, rate: 100Mbps}]\n")
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "topo", str(p)], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(lines) == 1 and "'100Mbps' read as 100Mbit" in lines[0], r.stderr


def test_training_durations_sizes_take_unit_strings() -> None:
    t = validate_training({"scheme": {"name": "bsp"}, "stop": {"steps": 5, "wall_s": "2min"},
                           "workload": {"name": "synthetic", "grad_bytes": "4KiB", "compute_s": "2ms"},
                           "comm_timeout_s": "30s", "connect_timeout_s": 5})
    assert (t.stop.wall_s, t.comm_timeout_s, t.connect_timeout_s) == (120.0, 30.0, 5.0)
    assert (t.workload.params.grad_bytes, t.workload.params.compute_s) == (4096, 0.002)
    with pytest.raises(ValidationError) as e:
        validate_training({"scheme": {"name": "bsp"}, "workload": {"name": "digits"}, "stop": {"wall_s": "2 fortnights"}})
    assert e.value.field == "training.stop.wall_s"
