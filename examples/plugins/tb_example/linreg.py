"""``linreg``: a linear model on seeded synthetic data (the whole Workload interface in one file)."""

from __future__ import annotations

import torch
from torch import nn

from testbed.training.workloads.base import Batch, Stream, Workload, seeded_init

from .params import LinRegParams


class LinRegWorkload(Workload):
    name = "linreg"
    has_accuracy = False

    def __init__(self, params: LinRegParams, seed: int) -> None:
        super().__init__(params, seed)
        g = seeded_init(seed + 17)  # the data do not depend on the model's seed offset
        self.w_true = torch.randn(params.features, 1, generator=g)
        x = torch.randn(params.samples + 512, params.features, generator=g)
        y = x @ self.w_true + params.noise * torch.randn(len(x), 1, generator=g)
        self.x, self.y = x[: params.samples], y[: params.samples]
        self.x_test, self.y_test = x[params.samples:], y[params.samples:]
        self.stream = Stream(params.samples, seed)  # the shared sharding rule (see base.py)

    def build_model(self) -> nn.Module:
        model = nn.Linear(self.params.features, 1)
        g = seeded_init(self.seed)
        with torch.no_grad():
            model.weight.normal_(0.0, 0.1, generator=g)
            model.bias.zero_()
        return model

    def batch(self, step: int, shard: int, num_shards: int) -> Batch:
        idx = torch.from_numpy(self.stream.indices(step, shard, num_shards, self.batch_size))
        return self.x[idx], self.y[idx]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float | None]:
        dev = next(model.parameters()).device
        pred = model(self.x_test.to(dev))
        return {"loss": float(nn.functional.mse_loss(pred, self.y_test.to(dev))), "acc": None}
