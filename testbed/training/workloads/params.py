"""Parameters of each workload (torch-free, so a spec validates without torch).

Units are in the field names or comments; ``batch_size`` is always *per
worker* (the global batch of one synchronous step is ``batch_size`` times
the number of workers that take part in it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from testbed.training.schema import ValidationError
from traffic_control.fields import Duration, Size


def _positive(field: str, name: str, value: float) -> None:
    if value <= 0:
        raise ValidationError(f"{field}.{name}" if field else name, f"must be > 0, got {value}", "use a positive value")


@dataclass
class DigitsParams:
    """sklearn's bundled 8x8 digits (1797 images, 10 classes)."""

    batch_size: int = 32  # samples per worker per step
    model: Literal["mlp", "cnn"] = "mlp"
    hidden: int = 64  # MLP hidden units / CNN channels of the 2nd conv
    holdout: float = 0.2  # fraction held out for evaluation (fixed split, seed 0)

    def check(self, field: str) -> None:
        _positive(field, "batch_size", self.batch_size)
        _positive(field, "hidden", self.hidden)
        if not 0.05 <= self.holdout <= 0.5:
            raise ValidationError(f"{field}.holdout", f"must be in [0.05, 0.5], got {self.holdout}", "use e.g. 0.2")


@dataclass
class CharLMParams:
    """Character-level causal transformer on the Python standard library's sources."""

    batch_size: int = 16  # sequences per worker per step
    seq_len: int = 64  # characters per sequence
    d_model: int = 48
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 96  # feed-forward hidden width
    domain: str | None = None  # stdlib domain (see charlm.DOMAINS); None = whole stdlib
    train_chars: int = 300_000  # characters of training text taken (deterministic file order)
    eval_chars: int = 16_384  # held-out characters evaluated (from files not in training)

    def check(self, field: str) -> None:
        for name in ("batch_size", "seq_len", "d_model", "n_heads", "n_layers", "d_ff", "train_chars", "eval_chars"):
            _positive(field, name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValidationError(f"{field}.n_heads", f"d_model {self.d_model} is not divisible by {self.n_heads}",
                                  "pick n_heads dividing d_model")
        if self.eval_chars < 2 * self.seq_len:
            raise ValidationError(f"{field}.eval_chars", "must be at least 2 x seq_len", "raise eval_chars")
        if self.domain is not None:
            from testbed.training.workloads.stdlib_text import DOMAINS

            if self.domain not in DOMAINS:
                raise ValidationError(f"{field}.domain", f"unknown domain {self.domain!r}",
                                      f"use one of {', '.join(sorted(DOMAINS))} or null")


@dataclass
class SyntheticParams:
    """A flat parameter vector with a quadratic loss; compute time is set, not measured.

    Give the gradient size as ``params`` (float32 count) or ``grad_bytes``
    (bytes, a multiple of 4), not both; default 262144 params = 1 MiB.
    ``compute_mode: sleep`` pads each step's compute to ``compute_s`` with
    ``time.sleep`` (exact, uses no CPU: the right choice on shared cores);
    ``busy`` spins on the clock (burns a core, shows CPU contention).
    ``layers`` splits the vector into that many parameter tensors (same values
    and loss): what DDP-style buckets (``ddp_overlap``) divide.
    """

    params: int | None = None
    grad_bytes: Size | None = None
    compute_s: Duration = 0.05  # seconds per step, before slowdown
    compute_mode: Literal["sleep", "busy"] = "sleep"
    batch_size: int = 1  # nominal samples per step (only used for accounting)
    noise: float = 0.5  # per-(worker, step) gradient scale drawn from U(1-noise, 1+noise)
    layers: int = 1  # parameter tensors the vector is held as (DDP-style buckets split between them)

    def check(self, field: str) -> None:
        if self.params is not None and self.grad_bytes is not None:
            raise ValidationError(f"{field}.grad_bytes", "give params or grad_bytes, not both", "drop one")
        if self.grad_bytes is not None and (self.grad_bytes <= 0 or self.grad_bytes % 4):
            raise ValidationError(f"{field}.grad_bytes", "must be a positive multiple of 4 (float32)",
                                  "round to a multiple of 4")
        if self.params is not None:
            _positive(field, "params", self.params)
        if self.compute_s < 0:
            raise ValidationError(f"{field}.compute_s", "must be >= 0", "use 0 or more seconds")
        if not 0 <= self.noise < 1:
            raise ValidationError(f"{field}.noise", "must be in [0, 1)", "use e.g. 0.5")
        _positive(field, "layers", self.layers)
        if self.layers > self.n_params:
            raise ValidationError(f"{field}.layers", f"{self.layers} layers for {self.n_params} parameters",
                                  "use at most one layer per parameter")

    @property
    def n_params(self) -> int:
        if self.grad_bytes is not None:
            return self.grad_bytes // 4
        return self.params if self.params is not None else 262_144
