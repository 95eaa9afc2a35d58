"""Time-varying WAN profiles: the generated schedules, their seeds, their errors, and their use in specs."""

from __future__ import annotations

import math

import pytest
import yaml

from tests.conftest import run_cli
from topologies import load
from traffic_control.errors import ValidationError
from traffic_control.profiles import generate, to_csv
from traffic_control.schedule import parse_schedule


def test_netstorm_redraws_every_direction_within_the_range_and_repeats_with_its_seed():
    topo = load("three_dc_triangle")
    spec = {"profile": "netstorm", "every": "5s", "range": [0.2, 1.0], "duration": "60s", "seed": 7}
    ev = generate(topo, spec)
    assert len(ev) == 12 * 6 and sorted({e.time_s for e in ev}) == [5.0 * k for k in range(12)]
    for e in ev:
        spec_rate = topo.link(e.src, e.dst).shape(e.src, e.dst).rate_bps
        assert 0.2 * spec_rate - 1000 <= e.changes["rate_bps"] <= spec_rate + 1000
    factors = [e.changes["rate_bps"] / topo.link(e.src, e.dst).shape(e.src, e.dst).rate_bps for e in ev]
    assert 0.5 < sum(factors) / len(factors) < 0.7  # uniform on [0.2, 1]: mean 0.6
    assert generate(topo, spec) == ev and generate(topo, dict(spec, seed=8)) != ev


def test_rates_are_spec_rates_before_scale():
    topo = load("geo_wan")  # scale 0.1: spec rates are ten times the emulated ones
    ev = generate(topo, {"profile": "netstorm", "every": "1s", "range": [1.0, 1.0], "duration": "1s"})
    for e in ev:
        assert e.changes["rate_bps"] == pytest.approx(topo.link(e.src, e.dst).shape(e.src, e.dst).rate_bps / 0.1)


def test_diurnal_follows_a_cosine_from_peak_to_trough_with_a_phase_per_link():
    topo = load("three_dc_triangle")
    ev = generate(topo, {"profile": "diurnal", "period": "60s", "low": 0.25, "step": "15s", "duration": "60s",
                         "phase_per_link": "15s", "links": ["east-central", "east-west"]})
    def factor(t, a, b):
        e = next(e for e in ev if e.time_s == t and (e.src, e.dst) == (a, b))
        return e.changes["rate_bps"] / topo.link(a, b).shape(a, b).rate_bps
    assert factor(0, "east", "central") == pytest.approx(1.0, abs=1e-4)
    assert factor(30, "east", "central") == pytest.approx(0.25, abs=1e-4)  # half a day: the trough
    assert factor(15, "east", "central") == pytest.approx(1 - 0.75 * (1 - math.cos(math.pi / 2)) / 2, abs=1e-4)
    assert factor(15, "east", "west") == pytest.approx(1.0, abs=1e-4)  # its day starts 15 s later
    assert {(e.src, e.dst) for e in ev} == {("east", "central"), ("central", "east"), ("east", "west"),
                                            ("west", "east")}


def test_the_csv_is_a_schedule_that_parses_back_to_the_same_events():
    topo = load("three_dc_triangle")
    ev = generate(topo, {"profile": "netstorm", "every": "2s", "range": [0.3, 0.9], "duration": "6s", "seed": 1})
    back = parse_schedule(to_csv(ev, "made by a test\nsecond line"))
    assert [(e.time_s, e.src, e.dst, e.both) for e in back] == [(e.time_s, e.src, e.dst, e.both) for e in ev]
    for a, b in zip(back, ev):
        assert a.changes["rate_bps"] == pytest.approx(b.changes["rate_bps"], rel=1e-9)


@pytest.mark.parametrize("spec, field", [
    ({"profile": "netstorm", "every": "0s", "range": [0.2, 1], "duration": "1s"}, "schedule.every"),
    ({"profile": "netstorm", "every": "1s", "range": [1, 0.2], "duration": "1s"}, "schedule.range"),
    ({"profile": "netstorm", "every": "1s", "range": [0.2], "duration": "1s"}, "schedule.range"),
    ({"profile": "netstorm", "every": "1ms", "range": [0.2, 1], "duration": "60min"}, "schedule"),
    ({"profile": "netstorm", "every": "1s", "range": [0.2, 1], "duration": "1s", "links": ["east-x"]},
     "schedule.links[0]"),
    ({"profile": "diurnal", "period": "1s", "low": 0, "step": "1s", "duration": "1s"}, "schedule.low"),
    ({"profile": "weekly"}, "schedule.profile"),
])
def test_bad_profiles_name_the_field(spec, field):
    with pytest.raises(ValidationError) as e:
        generate(load("three_dc_triangle"), spec)
    assert e.value.field == field, e.value


def test_an_experiment_spec_may_name_a_profile(tmp_path):
    from testbed.experiments.spec import parse_experiment

    spec = {"name": "x", "topology": "three_dc_triangle",
            "training": {"workload": {"name": "digits"}, "stop": {"steps": 5}},
            "schemes": [{"label": "bsp", "scheme": {"name": "bsp"}}],
            "schedule": {"profile": "netstorm", "every": "5s", "range": [0.5, 1.0], "duration": "20s", "seed": 2}}
    parsed = parse_experiment(spec)
    assert len(parsed.schedule) == 4 * 6 and parsed.schedule == generate(load("three_dc_triangle"), spec["schedule"])
    with pytest.raises(ValidationError) as e:
        parse_experiment(dict(spec, schedule=dict(spec["schedule"], range=[0.5, 20])))
    assert e.value.field == "schedule.range"


def test_the_cli_writes_a_schedule_net_up_accepts(tmp_path):
    out = tmp_path / "storm.csv"
    r = run_cli("profile", "netstorm", "three_dc_triangle", "--every", "5s", "--range", "0.2:1", "--duration", "20s",
                "--seed", "4", "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.startswith("# testbed profile netstorm for topology three_dc_triangle") and "seed=4" in text
    assert len(parse_schedule(text)) == 24
    bad = run_cli("profile", "netstorm", "three_dc_triangle", "--every", "5s", "--range", "x", "--duration", "20s")
    assert bad.returncode == 2 and "--range" in bad.stderr
    topo = tmp_path / "t.yaml"
    topo.write_text(yaml.safe_dump(load("three_dc_triangle").to_dict()))
    dry = run_cli("net", "up", str(topo), "--schedule", str(out), "--dry-run")
    assert dry.returncode == 0, dry.stderr


def test_each_profiles_schema_keys_are_the_loaders():
    from testbed.spec_schema import schema

    root = schema("experiment")
    union = next(a for a in root["properties"]["schedule"]["anyOf"] if "discriminator" in a)
    for name in ("netstorm", "diurnal"):
        ref = union["discriminator"]["mapping"][name]  # the tag's member, by a reference that resolves
        assert ref in [m["$ref"] for m in union["oneOf"]]
        props = set(root["$defs"][ref.removeprefix("#/$defs/")]["properties"])
        good = {"netstorm": {"every": "1s", "range": [0.5, 1], "duration": "2s"},
                "diurnal": {"period": "4s", "low": 0.5, "step": "1s", "duration": "2s"}}[name]
        with pytest.raises(ValidationError) as e:
            generate(load("three_dc_triangle"), {"profile": name, **good, "zz_unknown": 1})
        assert e.value.field == "schedule.zz_unknown"
        assert e.value.problem == "unknown key"
        assert {k.strip() for k in e.value.fix.removeprefix("use one of: ").split(",")} == props
