"""training.compute: validation, the profiled step-time arithmetic, and what the records say.

No network and no processes here (the loopback runs are in ``test_compute_loopback.py``).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from testbed.training.compute import (
    Accelerator,
    ComputeProfile,
    describe,
    format_profiles,
    message_floats,
    profiles,
    resolve,
    step_noise,
)
from testbed.training.config import validate_training
from traffic_control.errors import ValidationError

REPO = Path(__file__).resolve().parents[2]
RN50 = "resnet50-a100-amp"


def tc(compute, scheme="bsp", workers=None):
    return validate_training({"workload": "digits", "scheme": scheme, "compute": compute}, workers)


@pytest.mark.parametrize(("compute", "scheme", "workers", "field"), [
    ({"mode": "emulated"}, "bsp", None, "training.compute.profile"),
    ({"mode": "emulated", "profile": "no-such-gpu"}, "bsp", None, "training.compute.profile"),
    ({"mode": "fast"}, "bsp", None, "training.compute.mode"),
    ({"mode": "emulated", "profile": RN50, "time_scale": 0}, "bsp", None, "training.compute.time_scale"),
    ({"mode": "emulated", "profile": RN50, "cv": -0.1}, "bsp", None, "training.compute.cv"),
    ({"mode": "emulated", "profile": RN50, "factor_by_dc": {"a": 0}}, "bsp", None,
     "training.compute.factor_by_dc.a"),
    ({"mode": "emulated", "profile": RN50, "factor_by_dc": {"z": 2}}, "bsp", {"a1": "a", "b1": "b"},
     "training.compute.factor_by_dc.z"),
    ({"cv": 0.1}, "bsp", None, "training.compute.cv"),  # real mode: emulation knobs are mistakes
    ({"factor_by_dc": {"a": 2}}, "bsp", None, "training.compute.factor_by_dc"),
    ({"profile": RN50}, "bsp", None, "training.compute.profile"),  # real, no padding: unused profile
    ({"pad_gradient": True}, "bsp", None, "training.compute.pad_gradient"),
    ({"gradient_dtype": "fp16"}, "bsp", None, "training.compute.gradient_dtype"),
    # PGCS's per-expert buffers are not padded (the parameter-server schemes are: test_compute_loopback)
    ({"profile": RN50, "pad_gradient": True}, {"name": "pgcs", "experts": 2}, None, "training.compute.pad_gradient"),
    ({"profile": RN50, "pad_gradient": True}, "ddp_overlap", None, "training.compute.pad_gradient"),
    ({"mode": "emulated", "profile": {"model": "m", "gpu": "g", "batch_size": 0, "throughput": 10,
                                      "params": 10, "source": "s"}}, "bsp", None,
     "training.compute.profile.batch_size"),
    ({"mode": "emulated", "profile": RN50, "speed": 2}, "bsp", None, "training.compute.speed"),
])
def test_bad_compute_sections_name_their_field(compute, scheme, workers, field):
    with pytest.raises(ValidationError) as e:
        tc(compute, scheme, workers)
    assert e.value.field == field, str(e.value)
    assert e.value.fix


def test_good_sections_round_trip_and_default_is_real():
    assert tc({}).compute.mode == "real"
    assert validate_training({"workload": "digits", "scheme": "bsp"}).compute.mode == "real"
    t = tc({"mode": "emulated", "profile": RN50, "time_scale": 0.5, "cv": 0.1, "factor_by_dc": {"b": 2},
            "pad_gradient": True, "gradient_dtype": "fp16"}, workers={"a1": "a", "b1": "b"})
    assert validate_training(t.to_dict()).compute == t.compute
    inline = {"name": "mine", "model": "m", "gpu": "g", "batch_size": 4, "throughput": 80.0, "params": 10,
              "source": "measured by me"}
    t2 = tc({"mode": "emulated", "profile": inline})
    assert isinstance(t2.compute.profile, ComputeProfile)
    assert validate_training(t2.to_dict()).compute == t2.compute


def test_bundled_profiles_are_cited_and_their_step_time_is_batch_over_throughput():
    ps = profiles()
    assert len(ps) >= 4 and RN50 in ps
    for p in ps.values():
        assert p.source and p.url.startswith("https://") and p.params > 0
        assert p.step_s == pytest.approx(p.batch_size / p.throughput)
        assert p.grad_bytes("fp32") == 4 * p.params and p.grad_bytes("fp16") == 2 * p.params
    assert ps[RN50].step_s == pytest.approx(256 / 2470)  # DeepLearningExamples RN50, 1x A100, AMP
    assert ps[RN50].params == 25_557_032


def test_resolved_step_time_is_profile_times_scale_times_dc_factor():
    c = tc({"mode": "emulated", "profile": RN50, "time_scale": 0.5, "factor_by_dc": {"b": 1.5}}).compute
    a, b = resolve(c, "a"), resolve(c, "b")
    base = 256 / 2470
    assert a["step_s"] == pytest.approx(base * 0.5) and a["dc_factor"] == 1.0
    assert b["step_s"] == pytest.approx(base * 0.5 * 1.5) and b["dc_factor"] == 1.5
    assert a["profile"]["name"] == RN50 and a["profile"]["source"]
    acc = Accelerator(b, seed=1)  # cv 0: every step is exactly the profiled time
    assert [acc.profiled_s() for _ in range(5)] == pytest.approx([base * 0.75] * 5)


def test_step_variance_is_lognormal_with_mean_one_and_the_stated_cv():
    for cv in (0.05, 0.3):
        d = step_noise(cv)
        assert d.dist == "lognormal"
        c = tc({"mode": "emulated", "profile": RN50, "cv": cv}).compute
        acc = Accelerator(resolve(c, "a"), seed=7)
        x = np.array([acc.profiled_s() for _ in range(20000)]) / profiles()[RN50].step_s
        assert x.mean() == pytest.approx(1.0, abs=0.01)
        assert x.std() / x.mean() == pytest.approx(cv, rel=0.05)
        assert (x > 0).all()
        again = Accelerator(resolve(c, "a"), seed=7)  # seeded: a rerun draws the same steps
        assert [again.profiled_s() for _ in range(3)] == pytest.approx(list(x[:3] * profiles()[RN50].step_s))


def test_finish_sleeps_the_rest_of_the_step_and_reports_an_overrun():
    inline = {"name": "t", "model": "m", "gpu": "g", "batch_size": 1, "throughput": 25.0, "params": 10,
              "source": "test"}  # 40 ms a step
    acc = Accelerator(resolve(tc({"mode": "emulated", "profile": inline}).compute, "a"), seed=0)
    t0 = time.perf_counter()
    f = acc.finish(real_s=0.01, elapsed_s=0.01)
    took = time.perf_counter() - t0
    assert f["compute_mode"] == "emulated" and f["profile"] == "t"
    assert f["profiled_s"] == pytest.approx(0.04) and f["slept_s"] == pytest.approx(0.03)
    assert took >= 0.03 - 1e-3 and f["compute_overrun"] is False
    f = acc.finish(real_s=0.05, elapsed_s=0.05)  # the real compute was slower than the GPU would be
    assert f["slept_s"] == 0.0 and f["compute_overrun"] is True
    real = Accelerator(resolve(tc({}).compute, "a"), seed=0)
    assert real.finish(0.01, 0.01) == {"compute_mode": "real"} and real.pad_floats(100) == 0


def test_padding_makes_a_message_the_profiled_gradient_size():
    c = tc({"profile": RN50, "pad_gradient": True}).compute
    r = resolve(c, "a")
    assert r["message_floats"] == 25_557_032 == message_floats(profiles()[RN50], "fp32")
    acc = Accelerator(r, seed=0)
    n = 1000
    assert n + 1 + acc.pad_floats(n) == r["message_floats"]  # model + control slot + pad
    half = resolve(tc({"profile": RN50, "pad_gradient": True, "gradient_dtype": "fp16"}).compute, "a")
    assert 4 * half["message_floats"] == 2 * 25_557_032


def test_manifest_label_says_which_mode_ran():
    real = describe(tc({}).compute, "cpu")
    assert real["mode"] == "real" and real["label"] == "real CPU"
    em = describe(tc({"mode": "emulated", "profile": RN50, "time_scale": 0.5, "cv": 0.05}).compute, "auto")
    assert em["mode"] == "emulated" and "emulated A100" in em["label"] and "ResNet-50" in em["label"]
    assert em["profile"]["source"] and em["profile_step_s"] == pytest.approx(256 / 2470)


def test_trial_manifest_record(tmp_path):
    from testbed.experiments.trial import compute_record

    rec = compute_record({"workload": "digits", "scheme": "bsp", "device": "cpu",
                          "compute": {"mode": "emulated", "profile": RN50}})
    assert rec["mode"] == "emulated" and rec["profile"]["name"] == RN50
    json.dumps(rec)  # a manifest entry


def test_report_summary_states_the_compute_mode():
    import pandas as pd

    from testbed.analysis import report

    class T:
        trials = pd.DataFrame()

    mans = [{"scheme": "bsp-real", "compute": {"mode": "real", "label": "real CPU"}},
            {"scheme": "bsp-emulated", "compute": {"mode": "emulated", "label": "emulated A100 ResNet-50 profile"}}]
    text = report.compute_text(T(), mans)  # type: ignore[arg-type]
    assert "real CPU (bsp-real)" in text and "emulated A100 ResNet-50 profile (bsp-emulated)" in text
    assert report.compute_text(T(), mans[:1]) == "real CPU"  # type: ignore[arg-type]
    assert "not recorded" in report.compute_text(T(), [{}])  # type: ignore[arg-type]


def test_cli_lists_the_profiles_with_their_sources(capsys):
    from testbed.cli import main

    assert main(["compute-profiles"]) == 0
    out = capsys.readouterr().out
    for p in profiles().values():
        assert p.name in out and p.url in out
    assert main(["compute-profiles", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == set(profiles())
    assert all(math.isclose(r["step_s"], r["batch_size"] / r["throughput"]) for r in rows)
    assert format_profiles().splitlines()[0].startswith("name")


def test_the_compute_benchmark_spec_loads_and_compares_both_modes():
    from testbed.experiments.spec import load_experiment

    spec = load_experiment(REPO / "benchmarks" / "compute_modes.yaml")
    modes = {e.label: (e.training.get("compute") or {}).get("mode", "real") for e in spec.schemes}
    assert set(modes.values()) == {"real", "emulated"}
    for e in spec.schemes:
        validate_training(e.training)


def test_a_bad_dc_factor_in_a_spec_is_refused_with_its_path(tmp_path):
    from testbed.experiments.spec import load_experiment

    text = (REPO / "benchmarks" / "compute_modes.yaml").read_text().replace("factor_by_dc: {b: 1.25}",
                                                                          "factor_by_dc: {c: 1.25}", 1)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValidationError) as e:
        load_experiment(path)
    assert "compute.factor_by_dc.c" in e.value.field
