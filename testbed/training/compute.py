"""Compute as a named accelerator would spend it: profiles, the per-step time model, message padding.

Why: the testbed's workloads are small (a digits step computes in ~1 ms on a CPU), so every
scheme looks sync-bound, while real cross-DC training computes for tens to hundreds of ms per
step on a GPU.  ``training.compute.mode: emulated`` keeps the *real* forward/backward of the
small model (its gradients, so convergence is real) and then sleeps the rest of the step up to
the time the profiled model takes on the profiled GPU (``compute_profiles.yaml``: published
single-GPU throughputs, each with its source).  Sleeping is an honest model of an accelerator
(the host CPU idles while a GPU works) only when it is named as such: every record says which
mode ran (the ``compute`` span, the job file, the trial manifest, the report).

Per step, on a worker in DC ``d``::

    profiled_s = profile.step_s * time_scale * factor_by_dc.get(d, 1) * X
    X ~ lognormal with mean 1 and coefficient of variation ``cv`` (X = 1 when cv = 0)
    slept_s    = max(0, profiled_s - elapsed_s)   (elapsed: real compute, plus a synthetic pad)

``compute_overrun`` is true in the span when the real compute alone took longer than the
profile (nothing is slept then, and the step is slower than the profile says).  The slowdown
model (``training.slowdown``) applies on top of the profiled time, as it does on real compute.

``pad_gradient`` pads the messages the schemes send (BSP's gradient all-reduce, DiLoCo's outer
all-reduce, Gsyn's group all-reduce and broadcast, and the parameter server's pushes and pulls
for asp/ssp/gsyn) with zeros up to the profiled model's gradient size (fp32: 4 bytes a
parameter; fp16: the byte count of a half-precision gradient, carried as fp32 values), so the
network moves what the profiled model would move.

This module reads YAML and does arithmetic only (no torch): the config validator and the
``testbed compute-profiles`` command import it.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.training.schema import ValidationError, from_mapping, to_plain

__all__ = [
    "Accelerator", "ComputeProfile", "PROFILES_FILE", "describe", "draw_delay", "format_profiles",
    "message_floats", "profiles", "resolve", "resolve_profile", "step_noise",
]

PROFILES_FILE = Path(__file__).with_name("compute_profiles.yaml")


@dataclass
class ComputeProfile:
    """One published single-GPU training throughput (an entry of ``compute_profiles.yaml``, or
    written inline as ``training.compute.profile``): ``step_s = batch_size / throughput``."""

    model: str
    gpu: str
    batch_size: int
    throughput: float  # samples (images, sequences) per second on one GPU
    params: int  # parameter count of the profiled model (its gradient size)
    source: str  # where the numbers come from (table, container, row)
    name: str = "custom"
    precision: str = ""
    unit: str = "samples"
    url: str = ""

    def check(self, field: str) -> None:
        if self.batch_size < 1:
            raise ValidationError(f"{field}.batch_size", f"must be >= 1, got {self.batch_size}", "use the batch size of the source's row")
        if not self.throughput > 0:
            raise ValidationError(f"{field}.throughput", f"must be > 0, got {self.throughput}", "samples per second on one GPU")
        if self.params < 1:
            raise ValidationError(f"{field}.params", f"must be >= 1, got {self.params}", "the profiled model's parameter count")
        if not self.source.strip():
            raise ValidationError(f"{field}.source", "is empty", "say where the throughput was published")

    @property
    def step_s(self) -> float:
        return self.batch_size / self.throughput

    @property
    def label(self) -> str:
        return f"{self.gpu} {self.model}"

    def grad_bytes(self, dtype: str = "fp32") -> int:
        return self.params * (2 if dtype == "fp16" else 4)


@functools.cache
def profiles() -> dict[str, ComputeProfile]:
    """The bundled profiles by name (package data ``compute_profiles.yaml``)."""
    import yaml

    data = yaml.safe_load(PROFILES_FILE.read_text(encoding="utf-8"))
    out: dict[str, ComputeProfile] = {}
    for i, entry in enumerate(data["profiles"]):
        p = from_mapping(ComputeProfile, entry, f"{PROFILES_FILE.name}: profiles[{i}]")
        out[p.name] = p
    return out


def resolve_profile(value: str | ComputeProfile | None, field: str) -> ComputeProfile | None:
    """A profile name (bundled) or an inline profile -> the profile; unknown names are errors."""
    if value is None or isinstance(value, ComputeProfile):
        return value
    found = profiles().get(value)
    if found is None:
        raise ValidationError(field, f"unknown compute profile {value!r}",
                              f"use one of {', '.join(profiles())} (testbed compute-profiles), or write one inline")
    return found


def message_floats(profile: ComputeProfile, dtype: str) -> int:
    """fp32 values a padded gradient message holds so that its bytes are the profiled gradient's."""
    return profile.grad_bytes(dtype) // 4


def step_noise(cv: float) -> Any:
    """The per-step multiplier's distribution: lognormal with mean 1 and coefficient of variation
    ``cv``, as a :class:`~testbed.training.config.DelayDist` (median ``1/sqrt(1+cv^2)``, log-space
    sigma ``sqrt(ln(1+cv^2))``) so it is drawn like every other delay."""
    from testbed.training.config import DelayDist

    sigma = math.sqrt(math.log1p(cv * cv))
    return DelayDist(dist="lognormal", median_s=1.0 / math.sqrt(1.0 + cv * cv), sigma=sigma)


def draw_delay(d: Any, rng: Any) -> float:
    """One draw of a :class:`~testbed.training.config.DelayDist` (seconds) from numpy ``rng``."""
    if d.dist == "constant":
        return float(d.value_s)
    if d.dist == "uniform":
        return float(rng.uniform(d.low_s, d.high_s))
    if d.dist == "exponential":
        return float(rng.exponential(d.mean_s))
    if d.dist == "normal":
        return max(0.0, float(rng.normal(d.mean_s, d.std_s)))
    if d.dist == "lognormal":
        return float(d.median_s * math.exp(rng.normal(0.0, d.sigma)))
    raise ValueError(d.dist)


def resolve(cc: Any, dc: str | None) -> dict[str, Any]:
    """What one process's job file carries: the mode, the resolved profile, its DC's factor and
    the mean profiled step time (``training.compute`` = :class:`~testbed.training.config.ComputeConfig`)."""
    out: dict[str, Any] = {"mode": cc.mode}
    prof = resolve_profile(cc.profile, "training.compute.profile")
    if prof is None:
        return out
    factor = float(cc.factor_by_dc.get(dc, 1.0)) if dc is not None else 1.0
    out.update(profile=to_plain(prof), time_scale=cc.time_scale, dc_factor=factor, cv=cc.cv,
               step_s=prof.step_s * cc.time_scale * factor, pad_gradient=cc.pad_gradient,
               gradient_dtype=cc.gradient_dtype,
               message_floats=message_floats(prof, cc.gradient_dtype) if cc.pad_gradient else None)
    return out


def describe(cc: Any, device: str = "auto") -> dict[str, Any]:
    """The trial manifest's ``compute`` entry; ``label`` is what reports and figures print."""
    prof = resolve_profile(cc.profile, "training.compute.profile")
    if cc.mode == "real":
        where = {"cpu": "CPU", "cuda": "CUDA GPU"}.get(device, "CUDA if present, else CPU")
        label = f"real {where}"
    else:
        assert prof is not None
        label = f"emulated {prof.label} profile ({prof.name}: {prof.step_s * 1e3:.1f} ms/step"
        if cc.time_scale != 1.0:
            label += f" x {cc.time_scale:g}"
        label += f", cv {cc.cv:g})"
    out: dict[str, Any] = {"mode": cc.mode, "label": label, "device": device}
    if prof is not None:
        out.update(profile=to_plain(prof), profile_step_s=prof.step_s, time_scale=cc.time_scale,
                   factor_by_dc=dict(cc.factor_by_dc), cv=cc.cv, pad_gradient=cc.pad_gradient,
                   gradient_dtype=cc.gradient_dtype,
                   grad_bytes=prof.grad_bytes(cc.gradient_dtype) if cc.pad_gradient else None)
    return out


class Accelerator:
    """The per-step time model of one worker (from its job's resolved ``compute``)."""

    def __init__(self, resolved: dict[str, Any] | None, seed: int) -> None:
        import numpy as np

        r = resolved or {"mode": "real"}
        self.emulated = r.get("mode") == "emulated"
        self.step_s = float(r.get("step_s") or 0.0)
        self.profile_name = (r.get("profile") or {}).get("name")
        cv = float(r.get("cv") or 0.0)
        self.noise = step_noise(cv) if cv > 0 else None
        self.message_floats = r.get("message_floats") if r.get("pad_gradient") else None
        self.rng = np.random.default_rng([int(seed), 0xACCE1])

    def profiled_s(self) -> float:
        """This step's profiled compute time (one draw)."""
        x = draw_delay(self.noise, self.rng) if self.noise is not None else 1.0
        return self.step_s * x

    def pad_floats(self, n_params: int, control: int = 1) -> int:
        """Zero fp32 slots to append after a gradient of ``n_params`` and its ``control`` slot(s)."""
        if not self.message_floats:
            return 0
        return max(0, int(self.message_floats) - n_params - control)

    def plan(self, real_s: float, elapsed_s: float) -> tuple[float, dict[str, Any]]:
        """The rest of an emulated step (one draw of its profiled time) and the span fields that say
        what happens; sleeps nothing (``finish`` sleeps it; DDP-style overlap spreads it over backward)."""
        if not self.emulated:
            return 0.0, {"compute_mode": "real"}
        profiled = self.profiled_s()
        slept = max(0.0, profiled - elapsed_s)
        return slept, {"compute_mode": "emulated", "profile": self.profile_name, "profiled_s": round(profiled, 6),
                       "real_s": round(real_s, 6), "slept_s": round(slept, 6), "compute_overrun": real_s > profiled}

    def finish(self, real_s: float, elapsed_s: float) -> dict[str, Any]:
        """Sleep the rest of an emulated step; the span fields that say what happened."""
        slept, fields = self.plan(real_s, elapsed_s)
        if slept > 0:
            time.sleep(slept)
        return fields


def format_profiles() -> str:
    """The ``testbed compute-profiles`` table."""
    rows = [("name", "model", "GPU", "precision", "batch", "step (ms)", "params", "grad fp32 (MB)")]
    for p in profiles().values():
        rows.append((p.name, p.model, p.gpu, p.precision, str(p.batch_size), f"{p.step_s * 1e3:.1f}",
                     f"{p.params / 1e6:.1f} M", f"{p.grad_bytes() / 1e6:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    lines.append("Sources:")
    for p in profiles().values():
        lines.append(f"  {p.name}: {p.source} ({p.throughput:g} {p.unit}/s at batch {p.batch_size}); {p.url}")
    lines.append("")
    lines.append("step = batch / throughput on one GPU; use as training.compute: {mode: emulated, profile: NAME}.")
    return "\n".join(lines)
