"""A model whose parameters and gradients live in two flat buffers.

Why: every scheme moves *the whole* gradient or model as one message
(all-reduce buffer, server push/pull).  Making each parameter a view into
one contiguous tensor turns "flatten, send, unflatten" into "send the
buffer": no per-step copies, exact byte counts, and replicas that can be
compared element by element.  Gradients accumulate into their views
because autograd adds in place into an existing ``.grad``; so
``zero_grad()`` here zeroes the buffer instead of dropping the tensors.

``extra`` trailing slots in each buffer carry control values next to the
payload in the same message (a stop flag in an all-reduce, the model
version in a broadcast) so they cost no extra round trip.
"""

from __future__ import annotations

import torch
from torch import nn


class FlatModel:
    def __init__(self, model: nn.Module, device: torch.device | str = "cpu", extra: int = 0) -> None:
        self.model = model.to(device)
        self.device = torch.device(device)
        self.plist = list(self.model.parameters())
        self.n = sum(p.numel() for p in self.plist)
        self.extra = extra
        self.buf = torch.zeros(self.n + extra, dtype=torch.float32, device=self.device)
        self.grad_buf = torch.zeros(self.n + extra, dtype=torch.float32, device=self.device)
        off = 0
        for p in self.plist:
            k = p.numel()
            self.buf[off:off + k].copy_(p.detach().reshape(-1))
            p.data = self.buf[off:off + k].view_as(p)
            p.grad = self.grad_buf[off:off + k].view_as(p)
            off += k

    @property
    def params(self) -> torch.Tensor:
        """The flat parameters (a view; writing it changes the model)."""
        return self.buf[: self.n]

    @property
    def grads(self) -> torch.Tensor:
        return self.grad_buf[: self.n]

    @property
    def nbytes(self) -> int:
        return 4 * self.n

    def zero_grad(self) -> None:
        self.grad_buf.zero_()

    def load(self, flat: torch.Tensor) -> None:
        self.params.copy_(flat[: self.n])

    def snapshot(self) -> torch.Tensor:
        """A CPU copy of the parameters (for evaluation, saving, sending from GPU)."""
        return self.params.detach().to("cpu", copy=True)


def make_optimizer(cfg: object, params: list[torch.nn.Parameter], lr: float | None = None) -> torch.optim.Optimizer:
    """SGD or Adam from ``OptimizerConfig`` (foreach off: identical math on every process).

    ``lr``: the rate this process really uses (``testbed.training.lr.resolve_job``: the
    scheme's scaling rule applied to ``cfg.lr``); None = ``cfg.lr`` as written.
    """
    name = cfg.name  # type: ignore[attr-defined]
    rate = float(cfg.lr if lr is None else lr)  # type: ignore[attr-defined]
    if name == "sgd":
        return torch.optim.SGD(params, lr=rate, momentum=cfg.momentum,  # type: ignore[attr-defined]
                               weight_decay=cfg.weight_decay, foreach=False)  # type: ignore[attr-defined]
    if name == "adam":
        return torch.optim.Adam(params, lr=rate, weight_decay=cfg.weight_decay,  # type: ignore[attr-defined]
                                foreach=False)
    raise ValueError(f"unknown optimizer {name!r}")
