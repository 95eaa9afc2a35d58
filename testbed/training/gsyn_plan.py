"""Gsyn planner: predict the best number of groups G from measured inputs.

The Gsyn paper is closed-access; this is *our* model of its trade-off
(docs/DESIGN.md "Training model"), stated so it can be checked against a
measured sweep over G.

Model, for a grouping of the N workers into groups g of size m_g:

* **Waiting.**  A group moves at the pace of its slowest member, so one
  group step costs ``W_g = E[max_{i in g} C_i]`` of compute, with ``C_i``
  worker i's per-step compute time (independent draws from each host's
  measured distribution; ``E[max] = integral_0^inf (1 - prod_i F_i(t)) dt``,
  computed numerically).  Bigger groups wait longer.
* **Cycle.**  ``T_g = W_g + A_g + R_g + B_g``: in-group ring all-reduce
  ``A_g = a_kind * 2(m-1)/m`` (``a_kind`` = measured all-reduce time between
  two hosts, ``intra_dc`` or ``cross_dc`` when the group spans DCs; a ring's
  time scales with 2(m-1)/m of the two-host time when bandwidth-bound),
  leader's server round trip ``R_g`` (push + apply + pull, per leader DC),
  broadcast ``B_g = b_kind * (m-1)`` (the leader sends the model to each
  member in turn).  Groups do not overlap compute and communication.
* **Staleness.**  Groups run independently, so group g applies updates at
  ``lambda_g = 1/T_g`` (scaled down together if the server's apply time
  caps the total rate).  Between its pull and its next push (one cycle)
  the other groups apply ``tau_g = T_g * sum_{h != g} lambda_h`` updates:
  the expected staleness.  G = 1 gives tau = 0; equal groups give G - 1.
* **Progress.**  An update averages m_g workers' batches; we count its
  progress as ``(m_g / N) * f(tau_g)`` full-batch steps with
  ``f(tau) = 1 / (1 + beta * tau)`` - each unit of staleness costs a
  fraction ``beta`` of an update's worth (beta = 1 is the "divide the
  learning rate by the staleness" reading of staleness-aware SGD; beta = 0
  makes staleness free and the model pure throughput).  The progress rate
  is ``P(G) = sum_g lambda_g * (m_g / N) * f(tau_g)`` and the predicted time
  to a target is ``K / P(G)``.

``beta`` is an input (default 0.5); with a measured sweep
(``measured: {G: seconds}``) ``staleness_penalty: fit`` picks the beta
(grid over [0, 2]) and scale K that best match it in log time, so a report
can show prediction beside measurement and say how much staleness cost.

Spec (YAML or JSON; every time in seconds)::

    workers:                         # one entry per worker, in rank order
      - {host: a1, dc: a, compute_s: 0.050}                     # fixed time
      - {host: a2, dc: a, compute_s: {mean: 0.05, std: 0.01}}   # normal, clipped at 0
      - {host: b1, dc: b, compute_s: {median: 0.05, sigma: 0.3, dist: lognormal}}
      - {host: b2, dc: b, compute_s: {samples: [0.11, 0.12, 0.10]}}  # measured steps
    allreduce_s: {intra_dc: 0.004, cross_dc: 0.12}   # two-host all-reduce of the gradient
    broadcast_s: {intra_dc: 0.004, cross_dc: 0.12}   # one model copy; default = allreduce_s
    server_rtt_s: 0.08               # or {a: 0.02, b: 0.09}: by the leader's DC
    server_apply_s: 0.0              # server time per update (0 = no cap)
    staleness_penalty: 0.5           # beta, or "fit" (needs measured)
    candidates: [1, 2, 4]            # default: every G from 1 to N
    grouping: run                    # run: as gsyn forms groups for an integer G; speed: by compute time
    groups: {2: [[a1, a2], [b1, b2]]}  # explicit membership for some G (overrides grouping)
    measured: {1: 41.0, 2: 30.5, 4: 36.2}  # optional measured time to target per G
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from testbed.training.schema import ValidationError, from_mapping
from testbed.training.schemes.params import GsynParams

__all__ = ["PlanSpec", "Plan", "load_spec", "plan", "expected_max", "format_plan"]


# -- spec ---------------------------------------------------------------------------------------
@dataclass
class ComputeDist:
    """A host's per-step compute time: fixed (``mean`` only), normal, lognormal, or samples."""

    mean: float | None = None
    std: float | None = None
    median: float | None = None
    sigma: float | None = None
    samples: list[float] | None = None
    dist: Literal["normal", "lognormal", "samples", "fixed"] | None = None

    def check(self, field: str) -> None:
        kind = self.kind
        if kind == "samples" and not self.samples:
            raise ValidationError(f"{field}.samples", "empty", "give at least one measured step time")
        if kind == "lognormal" and (self.median is None or self.sigma is None):
            raise ValidationError(f"{field}.median", "lognormal needs median and sigma", "give both")
        if kind in ("normal", "fixed") and self.mean is None:
            raise ValidationError(f"{field}.mean", "missing", "give the mean compute time in seconds")
        for name in ("mean", "std", "median", "sigma"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValidationError(f"{field}.{name}", "must be >= 0", "use seconds >= 0")
        if self.samples and min(self.samples) < 0:
            raise ValidationError(f"{field}.samples", "negative time", "use seconds >= 0")

    @property
    def kind(self) -> str:
        if self.dist is not None:
            return self.dist
        if self.samples is not None:
            return "samples"
        if self.median is not None:
            return "lognormal"
        return "normal" if self.std else "fixed"

    @property
    def mean_s(self) -> float:
        k = self.kind
        if k == "samples":
            return float(np.mean(self.samples))
        if k == "lognormal":
            return float(self.median * math.exp(self.sigma**2 / 2))  # type: ignore[operator]
        return float(self.mean)  # type: ignore[arg-type]

    def upper(self) -> float:
        k = self.kind
        if k == "samples":
            return float(max(self.samples))  # type: ignore[arg-type]
        if k == "lognormal":
            return float(self.median * math.exp(8 * self.sigma))  # type: ignore[operator]
        return float(self.mean + 8 * (self.std or 0.0))  # type: ignore[operator]

    def cdf(self, t: np.ndarray) -> np.ndarray:
        from scipy import stats

        k = self.kind
        if k == "samples":
            s = np.sort(np.asarray(self.samples, dtype=float))
            return np.searchsorted(s, t, side="right") / len(s)
        if k == "lognormal":
            if self.sigma == 0:
                return (t >= self.median).astype(float)
            return stats.lognorm.cdf(t, s=self.sigma, scale=self.median)
        if not self.std:
            return (t >= self.mean).astype(float)
        return stats.norm.cdf(t, loc=self.mean, scale=self.std)  # mass below 0 sits at 0 (clipped)


@dataclass
class WorkerIn:
    host: str
    dc: str
    compute_s: float | ComputeDist

    @property
    def dist(self) -> ComputeDist:
        return self.compute_s if isinstance(self.compute_s, ComputeDist) else ComputeDist(mean=self.compute_s)


@dataclass
class ByKind:
    intra_dc: float
    cross_dc: float

    def check(self, field: str) -> None:
        if self.intra_dc < 0 or self.cross_dc < 0:
            raise ValidationError(field, "times must be >= 0", "use seconds >= 0")


@dataclass
class PlanSpec:
    workers: list[WorkerIn]
    allreduce_s: ByKind
    server_rtt_s: float | dict[str, float]
    broadcast_s: ByKind | None = None
    server_apply_s: float = 0.0
    staleness_penalty: float | Literal["fit"] = 0.5
    candidates: list[int] | None = None
    grouping: Literal["run", "speed"] = "run"
    groups: dict[str, list[list[str]]] = field(default_factory=dict)
    measured: dict[str, float] = field(default_factory=dict)

    def check(self, field: str) -> None:
        n = len(self.workers)
        if n == 0:
            raise ValidationError(f"{field}.workers", "no workers", "list every worker host")
        hosts = [w.host for w in self.workers]
        if len(set(hosts)) != n:
            raise ValidationError(f"{field}.workers", "a host is listed twice", "list each host once")
        for i, g in enumerate(self.candidates or []):
            if not 1 <= g <= n:
                raise ValidationError(f"{_j(field, 'candidates')}[{i}]", f"G={g} outside 1..{n}", f"use 1..{n}")
        if isinstance(self.server_rtt_s, dict):
            missing = sorted({w.dc for w in self.workers} - set(self.server_rtt_s))
            if missing:
                raise ValidationError(f"{_j(field, 'server_rtt_s')}", f"no round trip for DC {missing[0]!r}",
                                      "give every worker DC a value, or one number")
        if self.staleness_penalty == "fit" and len(self.measured) < 2:
            raise ValidationError(_j(field, "staleness_penalty"), "fit needs measured times for 2+ values of G",
                                  "give measured: {G: seconds, ...} or a number")
        if isinstance(self.staleness_penalty, float) and self.staleness_penalty < 0:
            raise ValidationError(_j(field, "staleness_penalty"), "must be >= 0", "use e.g. 0.5")
        for key, grps in self.groups.items():
            if not str(key).isdigit():
                raise ValidationError(f"{_j(field, 'groups')}.{key}", "keys are group counts G", "use e.g. 2:")
            try:
                GsynParams(groups=grps).check("")
                GsynParams(groups=grps).resolve([(w.host, w.dc) for w in self.workers], "")
            except ValidationError as exc:
                raise ValidationError(f"{_j(field, 'groups')}.{key}{exc.field}", exc.problem, exc.fix) from None
            if len(grps) != int(key):
                raise ValidationError(f"{_j(field, 'groups')}.{key}", f"lists {len(grps)} groups, not {key}",
                                      "give exactly G groups")
        for key in self.measured:
            if not str(key).isdigit() or not 1 <= int(key) <= n:
                raise ValidationError(f"{_j(field, 'measured')}.{key}", "keys are group counts G", f"use 1..{n}")


def _j(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b


def load_spec(data: Any) -> PlanSpec:
    """Validate a planner spec (mapping from YAML/JSON)."""
    if isinstance(data, Mapping):
        data = {**data, "groups": {str(k): v for k, v in (data.get("groups") or {}).items()},
                "measured": {str(k): v for k, v in (data.get("measured") or {}).items()}}
    return from_mapping(PlanSpec, data, "")


# -- the model -------------------------------------------------------------------------------------
def expected_max(dists: Sequence[ComputeDist], points: int = 20001) -> float:
    """E[max_i X_i] for independent non-negative X_i: integral of 1 - prod F_i over [0, upper]."""
    if all(d.kind == "fixed" or (d.kind == "normal" and not d.std) for d in dists):
        return max(float(d.mean) for d in dists)  # type: ignore[arg-type]
    hi = max(d.upper() for d in dists) * 1.0001 + 1e-12
    t = np.linspace(0.0, hi, points)
    joint = np.ones_like(t)
    for d in dists:
        joint *= d.cdf(t)
    return float(np.trapezoid(1.0 - joint, t)) if hasattr(np, "trapezoid") else float(np.trapz(1.0 - joint, t))


@dataclass
class GroupPrediction:
    hosts: list[str]
    wait_s: float  # E[max compute]
    allreduce_s: float
    server_rtt_s: float
    broadcast_s: float
    cycle_s: float
    rate: float  # updates/s
    staleness: float


@dataclass
class Candidate:
    g: int
    groups: list[GroupPrediction]
    updates_per_s: float
    mean_staleness: float  # update-weighted
    progress_rate: float  # full-batch steps' worth of progress per second
    rel_time: float = 1.0  # predicted time to target / best
    predicted_s: float | None = None  # calibrated with measured times
    measured_s: float | None = None


@dataclass
class Plan:
    best: int
    beta: float
    scale: float | None  # K in time = K / P, when calibrated
    candidates: list[Candidate]
    model: str = "time ~ 1/sum_g (m_g/N) / T_g / (1 + beta*tau_g); T_g = E[max C] + allreduce + rtt + bcast"

    def to_dict(self) -> dict[str, Any]:
        from testbed.training.schema import to_plain

        return to_plain(self)


def _groupings(spec: PlanSpec, g: int) -> list[list[int]]:
    workers = [(w.host, w.dc) for w in spec.workers]
    if str(g) in spec.groups:
        return GsynParams(groups=spec.groups[str(g)]).resolve(workers)
    if spec.grouping == "speed":
        order = sorted(range(len(workers)), key=lambda i: spec.workers[i].dist.mean_s)
        base, extra = divmod(len(order), g)
        out, start = [], 0
        for j in range(g):
            size = base + (1 if j < extra else 0)
            out.append(order[start:start + size])
            start += size
        return out
    return GsynParams(groups=g).resolve(workers)


def _rtt(spec: PlanSpec, dc: str) -> float:
    r = spec.server_rtt_s
    return float(r[dc]) if isinstance(r, dict) else float(r)


def structure(spec: PlanSpec, g: int) -> Candidate:
    """Groups, waits, cycles, rates and staleness for G = ``g`` (everything but the progress rate)."""
    bcast = spec.broadcast_s or spec.allreduce_s
    preds: list[GroupPrediction] = []
    for members in _groupings(spec, g):
        ws = [spec.workers[i] for i in members]
        m = len(ws)
        kind = "intra_dc" if len({w.dc for w in ws}) == 1 else "cross_dc"
        wait = expected_max([w.dist for w in ws])
        ar = getattr(spec.allreduce_s, kind) * 2 * (m - 1) / m if m > 1 else 0.0
        bc = getattr(bcast, kind) * (m - 1)
        rtt = _rtt(spec, ws[0].dc)
        cycle = wait + ar + rtt + bc
        rate = 1.0 / cycle if cycle > 0 else math.inf
        preds.append(GroupPrediction([w.host for w in ws], wait, ar, rtt, bc, cycle, rate, 0.0))
    total = sum(p.rate for p in preds)
    if spec.server_apply_s > 0 and total > 1.0 / spec.server_apply_s:
        scale = (1.0 / spec.server_apply_s) / total
        for p in preds:
            p.rate *= scale
        total = 1.0 / spec.server_apply_s
    for p in preds:
        p.staleness = (total - p.rate) / p.rate if p.rate > 0 else 0.0  # = T_g * sum of the others' rates
    mean_tau = sum(p.rate * p.staleness for p in preds) / total if total > 0 else 0.0
    return Candidate(g, preds, total, mean_tau, 0.0)


def progress_rate(c: Candidate, n: int, beta: float) -> float:
    """P = sum_g lambda_g * (m_g / N) / (1 + beta * tau_g)."""
    return sum(p.rate * (len(p.hosts) / n) / (1.0 + beta * p.staleness) for p in c.groups)


def predict(spec: PlanSpec, g: int, beta: float) -> Candidate:
    c = structure(spec, g)
    c.progress_rate = progress_rate(c, len(spec.workers), beta)
    return c


def _fit(spec: PlanSpec, cands: dict[int, Candidate]) -> tuple[float, float]:
    """beta and K minimising the squared log error of K/P(G) against the measured times."""
    n = len(spec.workers)
    meas = {int(k): float(v) for k, v in spec.measured.items()}
    structs = {g: cands[g] if g in cands else structure(spec, g) for g in meas}
    best = (math.inf, 0.5, 1.0)
    for beta in np.linspace(0.0, 2.0, 201):
        logs = np.array([math.log(meas[g] * progress_rate(structs[g], n, float(beta))) for g in meas])
        log_k = float(np.mean(logs))
        err = float(np.sum((logs - log_k) ** 2))
        if err < best[0] - 1e-12:
            best = (err, float(beta), math.exp(log_k))
    return best[1], best[2]


def plan(spec: PlanSpec) -> Plan:
    n = len(spec.workers)
    gs = sorted(set(spec.candidates or range(1, n + 1)))
    cands = {g: structure(spec, g) for g in gs}
    scale = None
    if spec.staleness_penalty == "fit":
        beta, scale = _fit(spec, cands)
    else:
        beta = float(spec.staleness_penalty)
    for c in cands.values():
        c.progress_rate = progress_rate(c, n, beta)
    if spec.measured and scale is None:
        logs = [math.log(float(v) * (cands[int(k)] if int(k) in cands else predict(spec, int(k), beta)).progress_rate)
                for k, v in spec.measured.items()]
        scale = math.exp(float(np.mean(logs)))
    top = max(c.progress_rate for c in cands.values())
    for c in cands.values():
        c.rel_time = top / c.progress_rate if c.progress_rate > 0 else math.inf
        c.predicted_s = scale / c.progress_rate if scale is not None and c.progress_rate > 0 else None
        c.measured_s = float(spec.measured[str(c.g)]) if str(c.g) in spec.measured else None
    best = max(cands.values(), key=lambda c: (c.progress_rate, -c.g)).g
    return Plan(best, beta, scale, list(cands.values()))


def format_plan(p: Plan) -> str:
    lines = [f"Gsyn plan: best G = {p.best}   (staleness penalty beta = {p.beta:.2f})",
             f"model: {p.model}", "",
             f"{'G':>3} {'E[max C] s':>11} {'cycle s':>9} {'upd/s':>8} {'staleness':>9} {'progress/s':>10} "
             f"{'rel time':>8} {'pred s':>8} {'meas s':>8}  groups"]
    for c in p.candidates:
        wait = sum(g.wait_s for g in c.groups) / len(c.groups)
        cycle = sum(g.cycle_s for g in c.groups) / len(c.groups)
        pred = f"{c.predicted_s:8.1f}" if c.predicted_s is not None else f"{'-':>8}"
        meas = f"{c.measured_s:8.1f}" if c.measured_s is not None else f"{'-':>8}"
        groups = " | ".join(",".join(g.hosts) for g in c.groups)
        mark = "*" if c.g == p.best else " "
        lines.append(f"{c.g:>2}{mark} {wait:11.4f} {cycle:9.4f} {c.updates_per_s:8.2f} {c.mean_staleness:9.2f} "
                     f"{c.progress_rate:10.3f} {c.rel_time:8.2f} {pred} {meas}  {groups}")
    return "\n".join(lines)


def _rank_order(w: Mapping[str, Any]) -> tuple[int, Any]:
    """Workers in rank order (``grouping: run`` forms groups as gsyn does, from the rank order);
    records without a rank keep their order of appearance after the ranked ones."""
    rank = w.get("rank")
    return (0, rank) if isinstance(rank, int) else (1, 0)


def inputs_from_spans(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Planner inputs measured from a trial's span records (a starting point for a spec).

    Per worker host: the ``compute`` span durations (samples).  Server round
    trip: median of a leader's push + wait-free pull (per DC).  Two-host
    all-reduce times are not derivable from arbitrary group sizes, so the
    ``allreduce_s``/``broadcast_s`` given here are medians of the recorded
    ``intra_sync``/``wan_sync`` ring all-reduce spans rescaled by
    ``m / (2(m-1))`` (the model's inverse); check them before use.  Workers
    are listed in rank order, as the run formed its groups.

    A member's all-reduce span starts when *it* enters the collective, so a
    fast member's span also holds its wait for the slowest one - time the
    model already counts as waiting (``E[max C]``).  One all-reduce (same
    ``trial``, ``phase``, ``group`` and ``step``) therefore contributes the
    span of its last member to arrive, the shortest: the communication alone.
    (Taking every member's span, a calibration with a 3x-slower DC measured a
    0.85 s cross-DC all-reduce of 32 kB, four times the last arriver's.)
    """
    workers: dict[str, dict[str, Any]] = {}
    rtt: dict[str, list[float]] = {}
    ar_once: dict[tuple[Any, ...], float] = {}  # one all-reduce -> its shortest member span, rescaled
    pushes: dict[tuple[Any, str, int], float] = {}  # (trial, host, step) -> push time
    for r in records:
        if r.get("role") != "worker":
            continue
        host, phase, dur = r["host"], r["phase"], r["dur"] / 1e9
        if phase == "compute":
            w = workers.setdefault(host, {"host": host, "dc": r.get("dc"), "rank": r.get("rank"), "samples": []})
            w["samples"].append(dur)
        elif phase == "push" and r.get("step") is not None:
            pushes[(r.get("trial"), host, r["step"])] = dur
        elif phase == "pull" and r.get("step") is not None and (r.get("trial"), host, r["step"]) in pushes:
            rtt.setdefault(r.get("dc"), []).append(pushes[(r.get("trial"), host, r["step"])] + dur)
        elif phase in ("intra_sync", "wan_sync") and r.get("op") == "ring_allreduce" and r.get("peers", 1) > 1:
            m = r["peers"]
            kind = "intra_dc" if phase == "intra_sync" else "cross_dc"
            one = (kind, r.get("trial"), r.get("group"), r.get("step"))
            if r.get("step") is None:  # no step to match members by: every span counts alone
                one += (len(ar_once),)
            t = dur * m / (2 * (m - 1))
            ar_once[one] = min(t, ar_once.get(one, t))
    ar: dict[str, list[float]] = {"intra_dc": [], "cross_dc": []}
    for (kind, *_), t in ar_once.items():
        ar[kind].append(t)
    out: dict[str, Any] = {
        "workers": [{"host": w["host"], "dc": w["dc"], "compute_s": {"samples": w["samples"]}}
                    for w in sorted(workers.values(), key=_rank_order)],
    }
    med = {k: float(np.median(v)) for k, v in ar.items() if v}
    if med:
        out["allreduce_s"] = {"intra_dc": med.get("intra_dc", med.get("cross_dc")),
                              "cross_dc": med.get("cross_dc", med.get("intra_dc"))}
    if rtt:
        out["server_rtt_s"] = {dc: float(np.median(v)) for dc, v in rtt.items()}
    return out
