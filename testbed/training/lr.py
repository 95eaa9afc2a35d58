"""The learning rate each process really uses: one stated rule per scheme (README "Learning rates").

Why: the schemes apply different gradients at one configured ``lr``.  BSP averages the
gradients of all N workers per update (an effective batch of N x ``batch_size``), ASP/SSP
apply one worker's gradient (1 x ``batch_size``), Gsyn one group's average (group size x
``batch_size``).  At one lr the step per sample differs up to N x, and time-to-accuracy then
mixes the scheme with the step size.  The rules here make the step a stated function of the
batch that one model update averages.

Rules (``training.optimizer.lr_rule``):

* ``none`` (the default: old specs run exactly as before): every process uses ``lr``.
* ``linear``: the linear scaling rule of Goyal et al. 2017 ("Accurate, Large Minibatch SGD:
  Training ImageNet in 1 Hour", arXiv:1706.02677): ``lr_used = lr * effective_batch /
  base_batch``, where ``effective_batch`` = workers averaged per model update x the
  workload's per-worker ``batch_size`` and ``base_batch`` defaults to that ``batch_size``
  (one worker: ``lr`` is the single-worker rate).  Stated for SGD.
* ``sqrt``: ``lr_used = lr * sqrt(effective_batch / base_batch)``, the square-root rule for
  adaptive optimizers (Adam) of Malladi et al. 2022 ("On the SDEs and Scaling Rules for
  Adaptive Gradient Algorithms", arXiv:2205.10287); the one to use with ``name: adam``.

Workers averaged per model update (``update_workers`` on the scheme's params dataclass):
BSP (ring, hierarchical) and PGCS / ddp_overlap: N; ASP and SSP: 1 (each push is one
update); Gsyn: the size of the pushing group (groups may differ, so the server keeps one lr
per group); DiLoCo: 1 for its inner steps (each worker steps on its own batch; the outer
step has its own ``outer_lr``, left alone).  A plug-in scheme declares its own by defining
``update_workers(self, world_size, groups) -> int | list[int]`` on its params dataclass (a
list: one entry per parameter-server client); without it, a scheme with a parameter server
counts 1 (one worker's push per update), one without counts all N (BSP-like).

Staleness (``training.optimizer.staleness_aware: true``): the parameter server divides the
lr of each update by ``max(1, staleness)``, the staleness-aware async-SGD rule of Zhang et
al. 2016 ("Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI, arXiv:1511.05950),
so a gradient computed on an old model moves it less.  Only processes that apply pushed
gradients (the server of asp/ssp/gsyn) have a staleness; other schemes ignore the flag.

Torch-free, so the runner and the tests resolve rates without importing torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["LR_RULES", "LrResolution", "resolve", "resolve_job", "staleness_lr", "update_workers"]

#: the rules ``training.optimizer.lr_rule`` accepts
LR_RULES = ("none", "linear", "sqrt")


def update_workers(params: Any, world_size: int, groups: Sequence[Sequence[int]] | None = None) -> int | list[int]:
    """Workers whose samples one model update averages: an int, or one per server client (Gsyn).

    The scheme's params dataclass says it (``update_workers``); the default for a plug-in
    that does not: 1 with a parameter server (a push is one worker's gradient), else
    ``world_size`` (every worker's gradient averaged, as BSP).
    """
    hook = getattr(params, "update_workers", None)
    if callable(hook):
        out = hook(world_size, [list(g) for g in groups] if groups is not None else None)
        return [int(v) for v in out] if isinstance(out, (list, tuple)) else int(out)
    return 1 if getattr(params, "uses_server", False) else int(world_size)


def _factor(rule: str, effective: int, base: int) -> float:
    if rule == "none":
        return 1.0
    ratio = effective / base
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    raise ValueError(f"unknown lr_rule {rule!r} (use one of {', '.join(LR_RULES)})")


def _of_client(value: Any, client: int | None, what: str) -> Any:
    """``value[client]`` for a per-client list, else ``value`` itself."""
    if isinstance(value, list):
        if client is None:
            raise ValueError(f"this {what} is per client; name the client")
        return value[client]
    return value


@dataclass
class LrResolution:
    """What lr a process uses and why (the job file's and the trial manifest's ``lr`` record)."""

    rule: str
    lr: float | list[float]  # lr used per update; a list = per server client (Gsyn group)
    base_lr: float  # training.optimizer.lr as written
    batch_size: int | None  # the workload's per-worker batch (None: the workload has none)
    base_batch: int  # the batch base_lr is meant for
    workers: int | list[int]  # workers averaged per update (per client when a list)
    effective_batch: int | list[int]
    staleness_aware: bool  # the server further divides each update's lr by max(1, staleness)

    def for_client(self, client: int | None = None) -> float:
        """The lr of updates pushed by ``client`` (a Gsyn group / PS worker), before staleness."""
        return _of_client(self.lr, client, "lr")

    def batch_for(self, client: int | None = None) -> int:
        """Training samples in one update pushed by ``client`` (what the evaluation cadence counts)."""
        return _of_client(self.effective_batch, client, "batch")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve(tc: Any, world_size: int, groups: Sequence[Sequence[int]] | None = None) -> LrResolution:
    """The lr(s) of a validated ``TrainingConfig`` on ``world_size`` workers (``groups``: Gsyn's)."""
    opt = tc.optimizer
    rule = getattr(opt, "lr_rule", "none")
    batch = getattr(tc.workload.params, "batch_size", None)
    batch = int(batch) if batch is not None else None
    base = getattr(opt, "base_batch", None) or batch or 1
    workers = update_workers(tc.scheme.params, world_size, groups)
    per = batch if batch is not None else base  # no batch: the workload's step is the unit

    def one(w: int) -> tuple[int, float]:
        eff = w * per
        return eff, float(opt.lr) * _factor(rule, eff, base)

    if isinstance(workers, list):
        pairs = [one(w) for w in workers]
        eff: int | list[int] = [e for e, _ in pairs]
        lr: float | list[float] = [v for _, v in pairs]
    else:
        eff, lr = one(workers)
    return LrResolution(rule, lr, float(opt.lr), batch, int(base), workers, eff,
                        bool(getattr(opt, "staleness_aware", False)))


def resolve_job(job: Any) -> LrResolution:
    """The lr record of one process's job (``make_jobs`` writes it; the same for every process
    of a trial), or, for a job without one, the resolution of its training section."""
    rec = getattr(job, "lr", None)
    if rec:
        return LrResolution(**rec)
    return resolve(job.training, job.world_size, job.groups)


def staleness_lr(lr: float, staleness: int | None) -> float:
    """Zhang et al. 2016: an update ``staleness`` versions old is applied at ``lr / max(1, staleness)``."""
    return lr / max(1, int(staleness or 0))
