"""training.compute on loopback: BSP with 2 workers (DCs a and b), the digits workload.

Emulated: every compute span lasts at least its profiled time, says what it slept, and the
real gradients still train the model.  Padded: the bytes BSP reports are the profiled gradient's,
and the padding changes no arithmetic (replicas equal the single-process reference).
"""

from __future__ import annotations

import json

import pytest

from tests.training.helpers import load_params, reference_params, spans

torch = pytest.importorskip("torch")
from testbed.training.local import run_local  # noqa: E402

pytestmark = pytest.mark.torch

DCS = {"a": 1, "b": 1}
RN50_STEP_S = 256 / 2470  # resnet50-a100-amp


def cfg(steps, compute, **extra):
    return {"workload": {"name": "digits", "batch_size": 16}, "scheme": {"name": "bsp"},
            "stop": {"steps": steps}, "optimizer": {"name": "sgd", "lr": 0.2}, "compute": compute, **extra}


def test_emulated_steps_last_the_profiled_time_and_real_gradients_still_learn(tmp_path):
    scale, fb = 0.5, 1.2  # ~52 ms a step in a, ~62 ms in b
    steps = 16
    config = cfg(steps, {"mode": "emulated", "profile": "resnet50-a100-amp", "time_scale": scale, "cv": 0.05,
                         "factor_by_dc": {"b": fb}}, eval_every=steps, save_model=True,
                 optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9})
    res = run_local(config, DCS, tmp_path, timeout_s=120)
    assert res.ok, res.diagnosis()
    comp = [s for s in spans(tmp_path, "worker") if s["phase"] == "compute"]
    assert len(comp) == 2 * steps
    for s in comp:
        assert s["compute_mode"] == "emulated" and s["profile"] == "resnet50-a100-amp"
        assert s["dur"] >= s["profiled_s"] * 1e9 - 1e5, s  # the span covers the whole profiled step
        # the sleep tops the real compute up to the profile: never more than the gap, and less only by
        # the time spent between measuring and sleeping (padding, the draw; ms on a loaded machine)
        gap = max(0.0, s["profiled_s"] - s["real_s"])
        assert s["compute_overrun"] or gap - 0.02 <= s["slept_s"] <= gap + 1e-4, s
        mean = RN50_STEP_S * scale * (fb if s["dc"] == "b" else 1.0)
        assert 0.7 * mean < s["profiled_s"] < 1.4 * mean, s  # cv 5 %: far inside
    job = json.loads((tmp_path / "jobs" / "1.json").read_text())
    assert job["compute"]["profile"]["name"] == "resnet50-a100-amp" and job["compute"]["dc_factor"] == fb
    assert job["compute"]["profile"]["source"]
    rows = [r.split(",") for r in (tmp_path / "metrics.csv").read_text().splitlines()[1:]]
    losses = [float(r[2]) for r in rows]
    assert len(losses) >= 2 and losses[-1] < losses[0] * 0.9, losses
    # the gradients are the real model's: the result is BSP's single-process reference, sleep or not
    ref = reference_params(config, 2, steps)
    assert torch.allclose(load_params(tmp_path, "worker", 0), ref, rtol=1e-5, atol=1e-6)


def test_padded_bsp_messages_carry_the_profiled_gradient_and_change_no_arithmetic(tmp_path):
    params = 200_000  # an inline profile, so the test moves 0.4-0.8 MB, not ResNet-50's 100 MB
    prof = {"name": "tiny", "model": "m", "gpu": "g", "batch_size": 1, "throughput": 100.0, "params": params,
            "source": "test"}
    steps = 3
    config = cfg(steps, {"profile": prof, "pad_gradient": True, "gradient_dtype": "fp16"}, save_model=True,
                 eval_every=1000)
    res = run_local(config, DCS, tmp_path, timeout_s=120)
    assert res.ok, res.diagnosis()
    sync = [s for s in spans(tmp_path, "worker") if s["phase"] in ("intra_sync", "wan_sync")]
    assert len(sync) == 2 * steps
    # a 2-rank ring sends 2 (n-1)/n = 1 x the message: exactly the fp16 gradient of the profile
    assert {s["bytes"] for s in sync} == {2 * params}
    comp = [s for s in spans(tmp_path, "worker") if s["phase"] == "compute"]
    assert {s["compute_mode"] for s in comp} == {"real"}
    finals = [load_params(tmp_path, "worker", r) for r in range(2)]
    assert torch.equal(finals[0], finals[1])
    ref = reference_params(config, 2, steps)
    assert torch.allclose(finals[0], ref, rtol=1e-5, atol=1e-6), (finals[0] - ref).abs().max()


@pytest.mark.parametrize("scheme", [{"name": "pgcs", "experts": 2, "sync": "allreduce"},
                                    {"name": "ddp_overlap", "buckets": 2}])
def test_pgcs_compute_loop_emulates_too(tmp_path, scheme):
    """PGCS and DDP-overlap run their own compute loop; it ends in the same tail as every scheme."""
    prof = {"name": "t40", "model": "m", "gpu": "g", "batch_size": 1, "throughput": 25.0, "params": 10,
            "source": "test"}  # 40 ms a step
    steps = 6
    config = {"workload": {"name": "synthetic", "params": 5_000}, "scheme": scheme, "stop": {"steps": steps},
              "eval_every": 1000, "compute": {"mode": "emulated", "profile": prof}}
    res = run_local(config, DCS, tmp_path, timeout_s=120)
    assert res.ok, res.diagnosis()
    comp = [s for s in spans(tmp_path, "worker") if s["phase"] == "compute"]
    assert len(comp) == 2 * steps
    for s in comp:
        assert s["compute_mode"] == "emulated" and s["profiled_s"] == pytest.approx(0.04)
        assert s["dur"] >= 0.04e9 - 1e5 or scheme["name"] == "ddp_overlap", s


@pytest.mark.parametrize("scheme", [{"name": "asp"}, {"name": "gsyn", "groups": 1}])
def test_padded_parameter_server_messages_carry_the_profiled_gradient(tmp_path, scheme):
    """Pushes and pulls of the parameter-server schemes are padded to the profile's gradient too;
    Gsyn with one group spanning both DCs also pads its group all-reduce and broadcast, and, being
    BSP through the server then, still equals the single-process reference."""
    params = 200_000
    prof = {"name": "tiny", "model": "m", "gpu": "g", "batch_size": 1, "throughput": 100.0, "params": params,
            "source": "test"}
    steps = 3
    config = cfg(steps, {"profile": prof, "pad_gradient": True, "gradient_dtype": "fp16"}, save_model=True,
                 eval_every=1000)
    config["scheme"] = scheme
    res = run_local(config, DCS, tmp_path, timeout_s=120)
    assert res.ok, res.diagnosis()
    msg = 2 * params  # the fp16 gradient of the profile, in bytes
    pushes = [s for s in spans(tmp_path, "worker") if s["phase"] == "push"]
    pulls = [s for s in spans(tmp_path, "server") if s["phase"] == "pull" and s.get("step") is not None]
    assert pushes and pulls
    for s in pushes + pulls:
        assert msg <= s["bytes"] <= msg + 1024, s  # the payload plus the frame's small JSON header
    if scheme["name"] == "gsyn":
        group = [s for s in spans(tmp_path, "worker") if s["phase"] in ("intra_sync", "wan_sync")]
        ring = [s for s in group if s.get("op") == "ring_allreduce"]
        bcast = [s for s in group if s.get("op") == "broadcast" and s["bytes"]]
        assert ring and {s["bytes"] for s in ring} == {msg}
        assert bcast and all(s["bytes"] == msg + 4 for s in bcast)  # params + version/stop slots
        finals = [load_params(tmp_path, "worker", r) for r in range(2)]
        ref = reference_params(config, 2, steps)
        assert torch.allclose(finals[0], ref, rtol=1e-5, atol=1e-6), (finals[0] - ref).abs().max()
