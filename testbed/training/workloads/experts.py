"""``experts``: E character-LM experts, each on its own stdlib text domain (PGCS's model).

Our reading of PGCS (closed-access paper; docs/DESIGN.md "Training model"): the
model is E >= 2 experts with *separate parameter sets*; every worker trains
every expert data-parallel, one expert per step (expert ``t mod E`` at step
``t``), so one expert's gradient can be synchronized while the next one
computes.  Experts do not share parameters or activations, so they can be
updated independently; which text each expert learns is our choice (as in
branch-train-merge, one domain per expert).

Each expert is a :class:`~testbed.training.workloads.charlm.CharLMWorkload`
on ``domains[k]`` with seed ``seed + 1000 k`` (so experts start from
different weights) and its own held-out loss.  :meth:`ExpertsWorkload.expert_workloads`
gives them to multi-expert schemes (``pgcs``, ``ddp_overlap``), which keep
one optimizer per expert and write a ``metrics.csv`` row per expert.

Under single-model schemes (``bsp`` ...) the workload still works: the
model is the ``ModuleList`` of experts, global step ``t`` trains expert
``t mod E`` on its ``t // E``-th batch (the batch carries the expert index
as its last tensor) and the whole model's gradient is synchronized, zeros
included; ``evaluate`` reports the mean over experts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from testbed.training.workloads.base import Batch, Workload
from testbed.training.workloads.charlm import CharLMWorkload
from testbed.training.workloads.experts_params import ExpertsParams
from testbed.training.workloads.params import CharLMParams

__all__ = ["EXPERT_SEED_STRIDE", "ExpertsWorkload", "expert_seed"]

#: Expert ``k`` of a model seeded ``seed`` is seeded ``seed + EXPERT_SEED_STRIDE * k``.
EXPERT_SEED_STRIDE = 1000


def expert_seed(seed: int, k: int) -> int:
    """The seed of expert ``k`` (weights and data stream)."""
    return int(seed) + EXPERT_SEED_STRIDE * k


class ExpertsWorkload(Workload):
    """E :class:`CharLMWorkload` experts on different domains (see the module doc)."""

    name = "experts"
    has_accuracy = True

    def __init__(self, params: ExpertsParams, seed: int) -> None:
        super().__init__(params, seed)
        self.domains = params.expert_domains()
        self.experts: list[CharLMWorkload] = []
        for k, domain in enumerate(self.domains):
            p = CharLMParams(batch_size=params.batch_size, seq_len=params.seq_len, d_model=params.d_model,
                             n_heads=params.n_heads, n_layers=params.n_layers, d_ff=params.d_ff, domain=domain,
                             train_chars=params.train_chars, eval_chars=params.eval_chars)
            self.experts.append(CharLMWorkload(p, expert_seed(seed, k)))

    @property
    def count(self) -> int:
        return len(self.experts)

    def expert_workloads(self) -> list[Workload]:
        """One single-model workload per expert (batches, loss, held-out evaluation)."""
        return list(self.experts)

    # -- the single-model view (round-robin over experts) -------------------------
    def build_model(self) -> nn.Module:
        return nn.ModuleList([e.build_model() for e in self.experts])

    def batch(self, step: int, shard: int, num_shards: int) -> Batch:
        k = step % self.count
        return (*self.experts[k].batch(step // self.count, shard, num_shards), torch.tensor(k))

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        k = int(batch[-1])
        return self.experts[k].loss(model[k], batch[:-1])  # type: ignore[index]

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float | None]:
        res = [e.evaluate(model[k]) for k, e in enumerate(self.experts)]  # type: ignore[index]
        out: dict[str, float | None] = {
            "loss": sum(float(r["loss"] or 0.0) for r in res) / len(res),
            "acc": sum(float(r["acc"] or 0.0) for r in res) / len(res),
        }
        for k, r in enumerate(res):
            out[f"loss_{k}"] = r["loss"]
        return out

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "experts": self.count, "domains": self.domains,
                "expert_workloads": [e.describe() for e in self.experts]}
