"""Units people write in specs: rates, times, percentages, sizes, packet counts."""

from __future__ import annotations

import pytest

from traffic_control.errors import ValidationError
from traffic_control.units import (
    format_rate,
    format_time,
    parse_packets,
    parse_percent,
    parse_rate,
    parse_size,
    parse_time,
)


@pytest.mark.parametrize("text,bps", [
    ("100Mbit", 100e6), ("1Gbit", 1e9), ("40Gbit", 40e9), ("512kbit", 512e3),
    ("100 Mbit", 100e6), ("10mbit", 10e6), ("12.5MBps", 100e6), ("1000", 1000.0), (1e9, 1e9),
    (250000, 250000.0), ("2e6bit", 2e6), ("1Tbit", 1e12),
])
def test_parse_rate(text, bps):
    assert parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text,seconds", [
    ("10ms", 0.01), ("250us", 250e-6), ("1.5s", 1.5), ("0.5", 0.5), (0.02, 0.02), ("1min", 60.0),
    ("100ns", 1e-7), ("20 msec", 0.02),
])
def test_parse_time(text, seconds):
    assert parse_time(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text,pct", [("0.5%", 0.5), ("0.5", 0.5), (2, 2.0), ("100%", 100.0), ("0%", 0.0)])
def test_parse_percent(text, pct):
    assert parse_percent(text) == pytest.approx(pct)


@pytest.mark.parametrize("text,size", [("100MB", 100 * 10**6), ("64KiB", 65536), ("1.5KiB", 1536), (1500, 1500),
                                       ("1GiB", 2**30), ("10kb", 10000)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text,n", [("1000", 1000), (1000, 1000), ("1000p", 1000), ("50packets", 50)])
def test_parse_packets(text, n):
    assert parse_packets(text) == n


@pytest.mark.parametrize("fn,value", [
    (parse_rate, "fast"), (parse_rate, "100Mbitz"), (parse_rate, "100 furlongs"), (parse_rate, True),
    (parse_rate, [1]), (parse_rate, float("inf")), (parse_rate, float("nan")), (parse_rate, ""),
    (parse_time, "soon"), (parse_time, "10 parsecs"), (parse_time, "10ms5"), (parse_time, None),
    (parse_percent, "5 percent"), (parse_percent, "0.5ms"), (parse_size, "10p"), (parse_size, "3 apples"),
    (parse_packets, "10.5"), (parse_packets, "10MB"),
])
def test_unparseable_names_the_field(fn, value):
    with pytest.raises(ValidationError) as ei:
        fn(value, "links[3].forward.thing")
    e = ei.value
    assert e.field == "links[3].forward.thing"
    assert str(e).startswith("links[3].forward.thing: ")
    assert e.fix, "every error says how to fix it"


def test_negative_numbers_parse_so_that_the_model_can_say_what_is_wrong():
    # A sign is accepted by the parser; LinkShape then rejects it with a precise message.
    assert parse_rate("-10Mbit") == -10e6
    assert parse_time("-5ms") == pytest.approx(-0.005)


def test_validation_error_under_prefixes_paths():
    e = ValidationError("rate", "bad", "fix it").under("links[0].forward")
    assert e.field == "links[0].forward.rate" and e.problem == "bad" and e.fix == "fix it"
    e2 = ValidationError("[2]", "bad").under("dcs")
    assert e2.field == "dcs[2]"


@pytest.mark.parametrize("bps", [8e3, 1e6, 123456789.0, 1.12e9, 40e9, 0.79e9 * 0.1, 33.3e6])
def test_format_rate_round_trips(bps):
    assert parse_rate(format_rate(bps)) == pytest.approx(bps, rel=1e-11)


@pytest.mark.parametrize("s", [0.0, 1e-6, 0.0055, 0.0123456789, 0.115, 1.5, 250e-6])
def test_format_time_round_trips(s):
    assert parse_time(format_time(s)) == pytest.approx(s, rel=1e-11, abs=1e-15)


def test_format_human_forms():
    assert format_rate(100e6) == "100Mbit"
    assert format_rate(1.12e9) == "1.12Gbit"
    assert format_time(0.01) == "10ms"
    assert format_time(2.0) == "2s"
    assert format_time(250e-6) == "250us"
