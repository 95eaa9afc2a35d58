"""``synthetic``: a set gradient size and a set compute time, for exact compute/comm ratios.

The model is one float32 vector ``w`` of ``n_params`` entries (held as ``layers``
parameter tensors, consecutive slices of it: the same numbers, the same loss and
gradients, but several tensors for DDP-style buckets to split, as a real model's
layers are; ``layers: 1`` gives no bucket anything to overlap); the loss of
worker ``r`` at step ``k`` is ``0.5 * c_rk * ||w - t||^2`` (gradient
``c_rk * (w - t)``, so SGD with lr < 1 contracts geometrically) with a fixed
target ``t`` and a per-(worker, step) scale ``c_rk ~ U(1-noise, 1+noise)``
(so workers' gradients differ and asynchrony matters, yet the problem is
convex and its held-out loss (per parameter) ``0.5 * ||w - t||^2 / n`` falls predictably).
The real arithmetic is a few elementwise passes; each step's compute is then
padded to ``compute_s`` seconds, by ``time.sleep`` (``compute_mode: sleep``,
exact and CPU-free: right on shared cores) or by spinning on the clock
(``busy``: occupies a core like real compute).  The slowdown model applies
on top of the padded time.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from testbed.training.workloads.base import Batch, Workload, seeded_init
from testbed.training.workloads.params import SyntheticParams


class FlatVector(nn.Module):
    """``w`` of ``n`` entries as ``layers`` parameters (one draw of ``n`` numbers, split): the values
    do not depend on ``layers``."""

    def __init__(self, n: int, gen: torch.Generator, layers: int = 1) -> None:
        super().__init__()
        self.ws = nn.ParameterList(nn.Parameter(c.clone()) for c in torch.randn(n, generator=gen).tensor_split(layers))


class SyntheticWorkload(Workload):
    name = "synthetic"
    has_accuracy = False

    def __init__(self, params: SyntheticParams, seed: int) -> None:
        super().__init__(params, seed)
        self.n = params.n_params
        g = seeded_init(seed + 1)
        self.target = torch.randn(self.n, generator=g) * 0.1
        self._target_dev: dict[str, torch.Tensor] = {}

    def _target(self, dev: torch.device) -> torch.Tensor:
        key = str(dev)
        if key not in self._target_dev:
            self._target_dev[key] = self.target.to(dev)
        return self._target_dev[key]

    def build_model(self) -> nn.Module:
        return FlatVector(self.n, seeded_init(self.seed), self.params.layers)

    def _pairs(self, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(layer, its slice of the target) for every layer."""
        ws = list(model.ws)  # type: ignore[attr-defined]
        return list(zip(ws, self._target(ws[0].device).split([w.numel() for w in ws]), strict=True))

    def batch(self, step: int, shard: int, num_shards: int) -> Batch:
        noise = self.params.noise
        c = np.random.default_rng([self.seed, step, shard, num_shards]).uniform(1 - noise, 1 + noise)
        return (torch.tensor([c], dtype=torch.float32),)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        c = batch[0].to(model.ws[0].device)[0]  # type: ignore[attr-defined]
        return 0.5 * c * sum(((w - t) * (w - t)).sum() for w, t in self._pairs(model))

    @torch.no_grad()
    def backward(self, model: nn.Module, batch: Batch) -> float:
        """The gradient ``c * (w - t)`` written directly (three passes over w instead of autograd's many)."""
        c = float(batch[0][0])
        sq = 0.0
        for w, t in self._pairs(model):
            d = w - t
            w.grad.add_(d, alpha=c)
            sq += float(torch.dot(d, d))
        return 0.5 * c * sq

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float | None]:
        sq = sum(float(((w - t) * (w - t)).sum()) for w, t in self._pairs(model))
        return {"loss": 0.5 * sq / self.n, "acc": None}

    def pad_left_s(self, elapsed_s: float) -> float:
        return max(0.0, self.params.compute_s - elapsed_s)

    def spend(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.params.compute_mode == "sleep":
            time.sleep(seconds)
        else:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass

    def describe(self) -> dict[str, object]:
        p = self.params
        return {"name": self.name, "params": self.n, "grad_bytes": 4 * self.n, "compute_s": p.compute_s,
                "compute_mode": p.compute_mode, "layers": p.layers}
