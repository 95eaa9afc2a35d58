"""The ``training`` section of an experiment spec, validated into :class:`TrainingConfig`.

Example (every key but ``workload`` and ``scheme`` has a default)::

    training:
      workload: {name: charlm, batch_size: 16}     # or just: workload: digits
      scheme: {name: gsyn, groups: 2}              # or: scheme: {name: ssp, staleness: 2}
      optimizer: {name: sgd, lr: 0.05, momentum: 0.0, lr_rule: linear}   # README "Learning rates"
      stop: {steps: 200, wall_s: 120, target: {metric: loss, value: 2.2}}
                                  # optional: give_up: {metric: loss, value: 2.0, after_s: 60}
      eval_every: 10              # or, the same cadence for every scheme:
      eval_every_samples: 2560    # a snapshot per 2560 training samples (all workers)
      device: auto
      backend: gloo               # or nccl: the workers' collectives on CUDA tensors over NCCL
      threads: 1
      seed: 0
      slowdown:
        - {dcs: [b], factor: 2.0}
        - {hosts: [a1], delay: {dist: exponential, mean_s: 0.02}}
      compute: {mode: emulated, profile: resnet50-a100-amp, cv: 0.05, factor_by_dc: {b: 1.5}}

``validate_training(cfg, workers=...)`` raises
``traffic_control.errors.ValidationError(field_path, problem, fix)`` for
anything wrong, before any process starts.  Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from testbed.training.compute import ComputeProfile
from testbed.training.schema import ValidationError, from_mapping, to_plain
from testbed.training.schemes import SCHEMES
from testbed.training.workloads import WORKLOADS
from traffic_control.fields import Duration

__all__ = [
    "ComputeConfig", "DelayDist", "FaultConfig", "GiveUpConfig", "NamedParams", "OptimizerConfig", "SlowdownRule", "StopConfig", "TargetConfig",
    "TrainingConfig", "validate_training", "workers_of",
]


@dataclass
class NamedParams:
    """A registry name plus its validated parameter dataclass (``{name: ..., **params}`` in YAML)."""

    name: str
    params: Any

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **to_plain(self.params)}


@dataclass
class OptimizerConfig:
    """Applied by every BSP worker, and by the parameter server for PS schemes.

    ``lr`` is the rate for ``base_batch`` samples per update; ``lr_rule`` says how each scheme
    scales it to the batch one of its updates really averages (``none``: every scheme uses
    ``lr`` as written, the default so that older specs run unchanged; ``linear``: Goyal et al.
    2017, for SGD; ``sqrt``: Malladi et al. 2022, for Adam).  ``base_batch`` defaults to the
    workload's per-worker ``batch_size`` (``lr`` is then the one-worker rate).
    ``staleness_aware``: the parameter server divides each update's lr by ``max(1, staleness)``
    (Zhang et al. 2016); schemes without a server ignore it.  The rules and their citations:
    ``testbed.training.lr``; the lr a trial used is in its manifest's ``lr``.
    """

    name: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.05
    momentum: float = 0.0  # sgd only
    weight_decay: float = 0.0
    lr_rule: Literal["none", "linear", "sqrt"] = "none"
    base_batch: int | None = None  # samples lr is meant for (default: the workload's batch_size)
    staleness_aware: bool = False  # server: lr / max(1, staleness) per update

    def check(self, field: str) -> None:
        if self.lr <= 0:
            raise ValidationError(f"{field}.lr", f"must be > 0, got {self.lr}", "use e.g. 0.05")
        if self.base_batch is not None and self.base_batch < 1:
            raise ValidationError(f"{field}.base_batch", f"must be >= 1, got {self.base_batch}",
                                  "give the batch lr was tuned for, or drop it (default: the workload's batch_size)")
        if not 0 <= self.momentum < 1:
            raise ValidationError(f"{field}.momentum", "must be in [0, 1)", "use e.g. 0.9")
        if self.weight_decay < 0:
            raise ValidationError(f"{field}.weight_decay", "must be >= 0", "use 0 or more")


@dataclass
class TargetConfig:
    """Stop when the held-out metric reaches ``value`` (acc >= value, loss <= value)."""

    metric: Literal["loss", "acc"]
    value: float


@dataclass
class GiveUpConfig:
    """Abandon a trial still short of ``value`` once ``after_s`` seconds have passed (``stop.give_up``).

    Why: a learning-rate search's diverged values otherwise train to the full wall cap (in the
    4-DC Gsyn search, two of gsyn-sa's five values sat at chance-level loss for all 300 s).  At
    every evaluation of a snapshot taken ``after_s`` or more seconds into training (the
    trial's clock, as ``wall_s``), the trial stops if the metric is worse than ``value``
    (loss > value, acc < value); a non-finite loss stops it at any time.  A trial that gave
    up never reached its target; its ``metrics.csv`` ends with that evaluation (then the
    final model's, as after any stop), and that evaluation's ``eval`` span says ``gave_up``.
    Choose ``value`` past anything a learning trial shows at ``after_s`` (e.g. chance-level
    loss), so that only hopeless trials stop.
    """

    metric: Literal["loss", "acc"]
    value: float
    after_s: Duration = 0.0

    def check(self, field: str) -> None:
        if self.after_s < 0:
            raise ValidationError(f"{field}.after_s", f"must be >= 0, got {self.after_s}", "use e.g. after_s: 60s")


@dataclass
class StopConfig:
    """When to stop; whichever comes first.  One of ``steps``/``wall_s`` is required.

    ``steps``: local iterations per worker (BSP: global steps; PS schemes:
    pushes per worker; Gsyn: pushes per group).  ``wall_s``: seconds since
    the trial's t0.  ``target``: a held-out metric threshold, checked at
    every evaluation.  ``give_up``: stop a hopeless trial early
    (:class:`GiveUpConfig`).
    """

    steps: int | None = 100
    wall_s: Duration | None = None
    target: TargetConfig | None = None
    give_up: GiveUpConfig | None = None

    def check(self, field: str) -> None:
        if self.steps is None and self.wall_s is None:
            raise ValidationError(f"{field}.steps", "neither steps nor wall_s is set",
                                  "set steps or wall_s so a run that never reaches its target still ends")
        if self.steps is not None and self.steps < 1:
            raise ValidationError(f"{field}.steps", f"must be >= 1, got {self.steps}", "use a positive count")
        if self.wall_s is not None and self.wall_s <= 0:
            raise ValidationError(f"{field}.wall_s", f"must be > 0, got {self.wall_s}", "use positive seconds")


@dataclass
class DelayDist:
    """Random extra compute delay per step, in seconds.

    ``constant``: ``value_s``; ``uniform``: ``low_s``..``high_s``;
    ``exponential``: mean ``mean_s``; ``normal``: ``mean_s``, ``std_s``
    (clipped at 0); ``lognormal``: median ``median_s``, log-space ``sigma``.
    ``prob``: chance that a step gets the delay at all (spiky stragglers).
    """

    dist: Literal["constant", "uniform", "exponential", "normal", "lognormal"]
    value_s: Duration | None = None
    low_s: Duration | None = None
    high_s: Duration | None = None
    mean_s: Duration | None = None
    std_s: Duration | None = None
    median_s: Duration | None = None
    sigma: float | None = None
    prob: float = 1.0

    _NEEDS = {
        "constant": ("value_s",), "uniform": ("low_s", "high_s"), "exponential": ("mean_s",),
        "normal": ("mean_s", "std_s"), "lognormal": ("median_s", "sigma"),
    }

    def check(self, field: str) -> None:
        needs = self._NEEDS[self.dist]
        for name in needs:
            v = getattr(self, name)
            if v is None:
                raise ValidationError(f"{field}.{name}", f"missing for dist {self.dist}", f"give {', '.join(needs)}")
            if v < 0:
                raise ValidationError(f"{field}.{name}", "must be >= 0", "use non-negative seconds")
        for f in dataclasses.fields(self):
            if f.name not in ("dist", "prob", *needs) and getattr(self, f.name) is not None:
                raise ValidationError(f"{field}.{f.name}", f"not used by dist {self.dist}",
                                      f"{self.dist} takes {', '.join(needs)}")
        if self.dist == "uniform" and self.low_s > self.high_s:  # type: ignore[operator]
            raise ValidationError(f"{field}.high_s", "must be >= low_s", "swap them")
        if not 0 < self.prob <= 1:
            raise ValidationError(f"{field}.prob", "must be in (0, 1]", "use e.g. 0.1")


@dataclass
class SlowdownRule:
    """Compute slowdown for the selected hosts (both lists empty = every worker).

    ``factor`` multiplies each step's compute time (>= 1; the extra is
    slept); ``delay`` adds a random extra time.  Several rules matching one
    host multiply their factors and add their delays.
    """

    hosts: list[str] = field(default_factory=list)
    dcs: list[str] = field(default_factory=list)
    factor: float = 1.0
    delay: DelayDist | None = None

    def check(self, field: str) -> None:
        if self.factor < 1:
            raise ValidationError(f"{field}.factor", f"must be >= 1, got {self.factor}",
                                  "slowdown only adds time; use 1 for none")

    def matches(self, host: str, dc: str) -> bool:
        if not self.hosts and not self.dcs:
            return True
        return host in self.hosts or dc in self.dcs


#: schemes whose every gradient/model message is one of the worker's flat buffers (or, for the
#: parameter server's pushes and pulls, padded to the same size), so that ``pad_gradient`` pads all
#: of it (PGCS's per-expert buffers are not padded)
PAD_GRADIENT_SCHEMES = ("bsp", "diloco", "asp", "ssp", "gsyn")


@dataclass
class ComputeConfig:
    """How a step's compute time is made (see :mod:`testbed.training.compute`).

    ``real``: the time the real forward/backward takes here (CPU or GPU).  ``emulated``: the
    real forward/backward, then a sleep up to ``profile``'s per-step time (a bundled name, see
    ``testbed compute-profiles``, or an inline profile) x ``time_scale`` x the worker's
    ``factor_by_dc`` x a lognormal draw of mean 1 and coefficient of variation ``cv``.
    ``pad_gradient``: pad BSP/DiLoCo/ASP/SSP/Gsyn messages to the profile's gradient size in
    ``gradient_dtype`` (also with ``mode: real``).
    """

    mode: Literal["real", "emulated"] = "real"
    profile: str | ComputeProfile | None = None
    time_scale: float = 1.0
    factor_by_dc: dict[str, float] = field(default_factory=dict)
    cv: float = 0.0
    pad_gradient: bool = False
    gradient_dtype: Literal["fp32", "fp16"] = "fp32"

    def check(self, field: str) -> None:
        from testbed.training.compute import resolve_profile

        if self.mode == "emulated" and self.profile is None:
            raise ValidationError(f"{field}.profile", "missing for mode emulated",
                                  "name a profile (testbed compute-profiles), e.g. profile: resnet50-a100-amp")
        if self.mode == "real":
            for name, unused in (("time_scale", self.time_scale != 1.0), ("factor_by_dc", bool(self.factor_by_dc)),
                                 ("cv", self.cv != 0.0)):
                if unused:
                    raise ValidationError(f"{field}.{name}", "only used with mode: emulated",
                                          "set mode: emulated, or remove it")
            if self.profile is not None and not self.pad_gradient:
                raise ValidationError(f"{field}.profile", "not used: mode is real and pad_gradient is off",
                                      "set mode: emulated or pad_gradient: true, or remove the profile")
        if self.pad_gradient and self.profile is None:
            raise ValidationError(f"{field}.pad_gradient", "needs a profile (its parameter count)",
                                  "name a profile, e.g. profile: resnet50-a100-amp")
        if self.gradient_dtype != "fp32" and not self.pad_gradient:
            raise ValidationError(f"{field}.gradient_dtype", "only used with pad_gradient: true",
                                  "set pad_gradient: true, or remove it")
        if not self.time_scale > 0:
            raise ValidationError(f"{field}.time_scale", f"must be > 0, got {self.time_scale}", "use e.g. 1 or 0.5")
        if not 0 <= self.cv <= 3:
            raise ValidationError(f"{field}.cv", f"must be in [0, 3], got {self.cv}", "use e.g. 0.05 (5 %)")
        for dc, f in self.factor_by_dc.items():
            if not f > 0:
                raise ValidationError(f"{field}.factor_by_dc.{dc}", f"must be > 0, got {f}",
                                      "use e.g. 1.5 for a DC whose GPUs are 1.5 x slower")
        resolve_profile(self.profile, f"{field}.profile")


@dataclass
class FaultConfig:
    """A real fault in one worker, to exercise supervision (the fault-injection tests, demos).

    The worker with ``host`` (or ``rank``) fails when it begins step
    ``step``: ``mode: raise`` raises (exit status 1, records flushed);
    ``kill`` sends itself SIGKILL (records only up to the last periodic flush);
    ``stop`` sends itself SIGSTOP (a hang: it stays alive and silent, its peers
    block on it); ``oom`` allocates and touches memory until the kernel's OOM
    killer ends it (its host's ``memory:`` limit), or raises after 64 GiB.
    """

    step: int
    host: str | None = None
    rank: int | None = None
    mode: Literal["raise", "kill", "stop", "oom"] = "raise"

    def check(self, field: str) -> None:
        if (self.host is None) == (self.rank is None):
            raise ValidationError(f"{field}.host", "give exactly one of host or rank", "name the worker to crash")
        if self.step < 0:
            raise ValidationError(f"{field}.step", "must be >= 0", "use a step number")


@dataclass
class TrainingConfig:
    """Validated ``training`` section; ``to_dict`` round-trips through ``validate_training``."""

    workload: Any  # NamedParams over WORKLOADS
    scheme: Any  # NamedParams over SCHEMES
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    stop: StopConfig = field(default_factory=StopConfig)
    eval_every: int = 10  # BSP: steps; PS schemes: server updates (used when eval_every_samples is unset)
    # One evaluation cadence for every scheme: a snapshot whenever the samples processed by all workers
    # together cross a multiple of this (see evaluator.EvalCadence); None = every eval_every updates.
    eval_every_samples: int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # The workers' collectives: gloo (default, CPU tensors) or NCCL on CUDA tensors, forced onto the
    # emulated interface (training.dist.nccl_env); the parameter server's TCP and BLP's point-to-point
    # executor stay on their own paths (TCP, gloo).  NCCL needs one GPU per worker (spec check).
    backend: Literal["gloo", "nccl"] = "gloo"
    threads: int = 1  # torch intra-op threads per process
    seed: int = 0
    slowdown: list[SlowdownRule] = field(default_factory=list)
    compute: ComputeConfig = field(default_factory=ComputeConfig)  # real, or an emulated accelerator
    rendezvous_port: int = 29500  # torch.distributed TCP store on rank 0's address
    server_port: int = 29600  # parameter server listens on its host's address
    comm_timeout_s: Duration = 300.0  # collective / server-reply timeout
    connect_timeout_s: Duration = 60.0  # how long a worker retries reaching the server
    save_model: bool = False  # write models/<role>.<rank>.pt (final flat parameters) at the end
    fault: FaultConfig | None = None  # deliberate worker crash (supervision tests)

    def check(self, field: str) -> None:
        if self.eval_every < 1:
            raise ValidationError(f"{field}.eval_every", "must be >= 1", "use e.g. 10")
        if self.eval_every_samples is not None and self.eval_every_samples < 1:
            raise ValidationError(f"{field}.eval_every_samples", "must be >= 1",
                                  "use e.g. 10 x workers x batch_size, or leave it out")
        if self.backend == "nccl" and self.device == "cpu":
            raise ValidationError(f"{field}.backend", "nccl runs collectives on CUDA tensors, but device is cpu",
                                  "device: cuda (with gpus: per trainer DC), or backend: gloo")
        if self.threads < 1:
            raise ValidationError(f"{field}.threads", "must be >= 1", "use 1 (default)")
        for name in ("rendezvous_port", "server_port"):
            port = getattr(self, name)
            if not 1 <= port <= 65535:
                raise ValidationError(f"{field}.{name}", f"{port} is not a TCP port", "use 1..65535")
        if self.rendezvous_port == self.server_port:
            raise ValidationError(f"{field}.server_port", "equals rendezvous_port", "use different ports")
        if self.comm_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ValidationError(f"{field}.comm_timeout_s", "timeouts must be > 0", "use positive seconds")

    @property
    def uses_server(self) -> bool:
        return bool(self.scheme.params.uses_server)

    def to_dict(self) -> dict[str, Any]:
        out = to_plain(self)
        out["workload"] = self.workload.to_dict()
        out["scheme"] = self.scheme.to_dict()
        return out


def _named(registry: Any, value: Any, field: str) -> NamedParams:
    if isinstance(value, NamedParams):
        return value
    if isinstance(value, str):
        name, params = value, {}
    elif isinstance(value, Mapping):
        if "name" not in value:
            raise ValidationError(f"{field}.name", "missing", f"use one of {', '.join(registry.names())}")
        name = value["name"]
        params = {k: v for k, v in value.items() if k != "name"}
    else:
        raise ValidationError(field, f"expected a name or a mapping, got {type(value).__name__}",
                              f"e.g. {{name: {registry.names()[0]}}}")
    if not isinstance(name, str):
        raise ValidationError(f"{field}.name", f"expected a string, got {name!r}", "write a name")
    registry.entry(name, f"{field}.name")
    return NamedParams(name, registry.parse_params(name, params, field))


def workers_of(workers: Mapping[str, str] | Sequence[Any] | None) -> list[tuple[str, str]] | None:
    """Normalise ``{host: dc}`` or ``[(host, dc)]`` / placements with ``.host``/``.dc``."""
    if workers is None:
        return None
    if isinstance(workers, Mapping):
        return [(str(h), str(d)) for h, d in workers.items()]
    out = []
    for w in workers:
        if hasattr(w, "host"):
            out.append((w.host, w.dc))
        else:
            h, d = w
            out.append((str(h), str(d)))
    return out


def validate_training(
    cfg: Any,
    workers: Mapping[str, str] | Sequence[Any] | None = None,
    field: str = "training",
) -> TrainingConfig:
    """Check the training section; ``workers`` (host -> DC, in rank order) enables the checks
    that need the hosts (G vs worker count, group membership, slowdown host/DC names)."""
    if isinstance(cfg, TrainingConfig):
        cfg = cfg.to_dict()
    if not isinstance(cfg, Mapping):
        raise ValidationError(field, f"expected a mapping, got {type(cfg).__name__}", "write a YAML mapping")
    for key in ("workload", "scheme"):
        if key not in cfg:
            reg = WORKLOADS if key == "workload" else SCHEMES
            raise ValidationError(f"{field}.{key}", "missing", f"add {key}: {{name: ...}} ({', '.join(reg.names())})")
    data = dict(cfg)
    data["workload"] = _named(WORKLOADS, cfg["workload"], f"{field}.workload")
    data["scheme"] = _named(SCHEMES, cfg["scheme"], f"{field}.scheme")
    tc = from_mapping(TrainingConfig, data, field)
    hook = getattr(tc.scheme.params, "check_training", None)  # cross-section checks of a scheme (pgcs)
    if callable(hook):
        hook(tc, workers_of(workers), f"{field}.scheme")
    if tc.compute.pad_gradient and tc.scheme.name not in PAD_GRADIENT_SCHEMES:
        raise ValidationError(f"{field}.compute.pad_gradient", f"not supported by scheme {tc.scheme.name}",
                              f"use it with {' or '.join(PAD_GRADIENT_SCHEMES)}, or set pad_gradient: false")
    _check_against_workers(tc, workers_of(workers), field)
    return tc


def _check_against_workers(tc: TrainingConfig, workers: list[tuple[str, str]] | None, field: str) -> None:
    if workers is None:
        return
    if not workers:
        raise ValidationError(field, "no worker hosts", "give the topology at least one trainer host")
    hosts = {h for h, _ in workers}
    dcs = {d for _, d in workers}
    if len(hosts) != len(workers):
        raise ValidationError(field, "two workers share a host name", "give every worker its own host")
    if tc.scheme.name == "gsyn":
        tc.scheme.params.resolve(workers, f"{field}.scheme.groups")
    if tc.fault is not None:
        f = tc.fault
        if f.host is not None and f.host not in hosts:
            raise ValidationError(f"{field}.fault.host", f"host {f.host!r} is not a worker host",
                                  f"use hosts from: {', '.join(sorted(hosts))}")
        if f.rank is not None and not 0 <= f.rank < len(workers):
            raise ValidationError(f"{field}.fault.rank", f"no worker rank {f.rank}", f"use 0..{len(workers) - 1}")
    for d in tc.compute.factor_by_dc:
        if d not in dcs:
            raise ValidationError(f"{field}.compute.factor_by_dc.{d}", f"DC {d!r} has no worker",
                                  f"use DCs from: {', '.join(sorted(dcs))}")
    for i, rule in enumerate(tc.slowdown):
        for h in rule.hosts:
            if h not in hosts:
                raise ValidationError(f"{field}.slowdown[{i}].hosts", f"host {h!r} is not a worker host",
                                      f"use hosts from: {', '.join(sorted(hosts))}")
        for d in rule.dcs:
            if d not in dcs:
                raise ValidationError(f"{field}.slowdown[{i}].dcs", f"DC {d!r} has no worker",
                                      f"use DCs from: {', '.join(sorted(dcs))}")
