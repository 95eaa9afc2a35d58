"""``digits``: a small MLP or CNN on scikit-learn's bundled 8x8 digits.

The data ships inside scikit-learn (no download).  The held-out split is
fixed (seed 0, ``holdout`` fraction, stratified by nothing: a plain
permutation) so every seed and scheme is evaluated on the same images;
the training order follows the shared sharding rule of ``base``.
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from testbed.training.workloads.base import Batch, Stream, Workload, init_like_default, seeded_init
from testbed.training.workloads.params import DigitsParams


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(1797x64 pixel values 0..16, labels): scikit-learn's bundled ``digits.csv.gz``.

    Read with numpy straight from the installed package, because importing
    scikit-learn costs over a second per process (every worker and the server
    load the data); falls back to ``sklearn.datasets.load_digits``.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as fh:
                data = np.loadtxt(fh, delimiter=",")
            return data[:, :-1], data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data, d.target


class DigitsMLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class DigitsCNN(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, hidden, 3, padding=1)
        self.fc = nn.Linear(hidden * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 1, 8, 8)
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)  # 4x4
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)  # 2x2
        return self.fc(x.flatten(1))


class DigitsWorkload(Workload):
    name = "digits"
    has_accuracy = True

    def __init__(self, params: DigitsParams, seed: int) -> None:
        super().__init__(params, seed)
        images, target = load_digits_arrays()
        x = torch.tensor(images / 16.0, dtype=torch.float32)
        y = torch.tensor(target, dtype=torch.int64)
        order = np.random.default_rng(0).permutation(len(y))
        n_held = int(round(len(y) * params.holdout))
        held, train = order[:n_held], order[n_held:]
        self.x_train, self.y_train = x[train], y[train]
        self.x_held, self.y_held = x[held], y[held]
        self.stream = Stream(len(train), seed)

    def build_model(self) -> nn.Module:
        p = self.params
        model: nn.Module = DigitsMLP(p.hidden) if p.model == "mlp" else DigitsCNN(p.hidden)
        init_like_default(model, seeded_init(self.seed))
        return model

    def batch(self, step: int, shard: int, num_shards: int) -> Batch:
        idx = torch.from_numpy(self.stream.indices(step, shard, num_shards, self.batch_size))
        return self.x_train[idx], self.y_train[idx]

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float | None]:
        dev = next(model.parameters()).device
        logits = model(self.x_held.to(dev))
        y = self.y_held.to(dev)
        return {"loss": float(F.cross_entropy(logits, y)), "acc": float((logits.argmax(1) == y).float().mean())}

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "train": len(self.y_train), "held_out": len(self.y_held)}
