"""What every workload provides, and the one data-sharding rule all schemes share.

Sharding rule (why BSP over N workers equals one process on the
concatenated batch): the training set is read as an endless stream of
seeded per-epoch permutations; *global* step ``k`` with ``num_shards``
workers of ``batch_size`` each covers stream positions
``[k*G, (k+1)*G)``, ``G = num_shards*batch_size``, and worker ``shard``
takes the ``shard``-th slice of it.  One process with batch ``N*b`` and one
shard therefore sees exactly the concatenation of the N workers' batches.
Asynchronous schemes use the same rule with the worker's own step count, so
a worker's data never depends on timing and runs are replayable.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import torch
from torch import nn

Batch = tuple[torch.Tensor, ...]


class Workload(ABC):
    """A model, its data, its loss and its held-out evaluation."""

    name: str = ""
    has_accuracy: bool = False

    def __init__(self, params: Any, seed: int) -> None:
        self.params = params
        self.seed = int(seed)

    @property
    def batch_size(self) -> int:
        return int(self.params.batch_size)

    @abstractmethod
    def build_model(self) -> nn.Module:
        """The model with deterministic initial weights (same on every process for one seed)."""

    @abstractmethod
    def batch(self, step: int, shard: int, num_shards: int) -> Batch:
        """This shard's batch of global step ``step`` (CPU tensors; see the module doc)."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean loss over the batch (a scalar tensor)."""

    def backward(self, model: nn.Module, batch: Batch) -> float:
        """Accumulate the batch gradient into the parameters' ``.grad``; returns the loss.

        Default: autograd on :meth:`loss`.  A workload may compute its
        gradient directly (the synthetic one does, to keep real work small).
        """
        loss = self.loss(model, batch)
        loss.backward()
        return float(loss.detach())

    @abstractmethod
    def evaluate(self, model: nn.Module) -> dict[str, float | None]:
        """Held-out ``{"loss": ..., "acc": ... or None}``."""

    def pad_left_s(self, elapsed_s: float) -> float:
        """Seconds of set compute still to spend after ``elapsed_s`` of real compute (the synthetic
        workload pads each step to its ``compute_s``; real workloads: none)."""
        return 0.0

    def spend(self, seconds: float) -> None:
        """Spend padded compute time as this workload does (default: sleep)."""
        if seconds > 0:
            time.sleep(seconds)

    def pad_compute(self, elapsed_s: float) -> None:
        """Pad a step's compute that took ``elapsed_s`` to the workload's set time (if it has one)."""
        self.spend(self.pad_left_s(elapsed_s))

    def describe(self) -> dict[str, Any]:
        """Facts for the manifest (sizes, fingerprints)."""
        return {"name": self.name}


class Stream:
    """Seeded endless stream over ``n`` items, one permutation per epoch."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        p = self._perms.get(epoch)
        if p is None:
            if len(self._perms) > 4:
                self._perms.clear()
            p = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._perms[epoch] = p
        return p

    def indices(self, step: int, shard: int, num_shards: int, batch_size: int) -> np.ndarray:
        start = (step * num_shards + shard) * batch_size
        pos = np.arange(start, start + batch_size)
        out = np.empty(batch_size, dtype=np.int64)
        for epoch in np.unique(pos // self.n):
            sel = pos // self.n == epoch
            out[sel] = self._perm(int(epoch))[pos[sel] % self.n]
        return out


def seeded_init(seed: int) -> torch.Generator:
    """Generator for parameter init, so models do not depend on the global RNG."""
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def init_like_default(module: nn.Module, gen: torch.Generator) -> None:
    """Re-initialise Linear/Conv/Embedding/LayerNorm weights from ``gen`` (deterministic)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            fan_in = m.weight[0].numel()
            bound = 1.0 / max(1, fan_in) ** 0.5
            with torch.no_grad():
                m.weight.uniform_(-bound, bound, generator=gen)
                if m.bias is not None:
                    m.bias.uniform_(-bound, bound, generator=gen)
        elif isinstance(m, nn.Embedding):
            with torch.no_grad():
                m.weight.normal_(0.0, 0.02, generator=gen)
        elif isinstance(m, nn.LayerNorm):
            with torch.no_grad():
                m.weight.fill_(1.0)
                m.bias.zero_()
