"""The experiment spec: one YAML file for a whole comparison.

```yaml
name: demo                      # results/<name>/<run-id>/
topology: three_dc_triangle     # bundled name, a path, or an inline topology mapping
scale: 1.0                      # multiply WAN rates (recorded)
impairment: auto                # auto | netem | userspace | none
allow_missing_netem: false
repetitions: 1                  # trials per scheme, each on a fresh network
seed: 1                         # repetition r uses seed + r
timeout: 600s                   # per trial, then the trial is stopped and marked failed
stall: 180s                     # a worker without progress this long (hung, SIGSTOPped, blocked on a dead
                                # peer) stops the trial, marked failed, naming it
training: {...}                 # base training section (workload, stop, optimizer, ...)
schemes:                        # what to compare; each entry overrides `training`
  - bsp                         # shorthand for {label: bsp, scheme: {name: bsp}}
  - {label: gsyn, scheme: {name: gsyn}}
collectors: {rate_hz: 10, links: true, procs: true}
```
Every error names its field and exits with status 2 before anything is built.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topologies import Topology, from_dict, load
from topologies.loader import read_mapping
from traffic_control.errors import ValidationError, check_keys
from traffic_control.units import parse_time

from ..network.addressing import plan_network
from ..network.emulation import IMPAIRMENTS

#: a worker without progress this long (no span, and no CPU time before its first) fails its trial
DEFAULT_STALL_S = 180.0

#: keys that do not change what a trial is (how many, where stored, prose): not hashed
HASH_EXEMPT = ("repetitions", "results_dir", "description")
KEYS = ("name", "description", "topology", "scale", "impairment", "allow_missing_netem", "repetitions", "seed",
        "timeout", "stall", "training", "schemes", "collectors", "results_dir", "schedule")
COLLECTOR_KEYS = ("rate_hz", "links", "procs", "trace")


@dataclass
class SchemeRun:
    label: str
    training: dict[str, Any]


@dataclass
class Collectors:
    rate_hz: float = 10.0
    links: bool = True
    procs: bool = True
    trace: bool = True


@dataclass
class ExperimentSpec:
    name: str
    topology: Topology
    schemes: list[SchemeRun]
    repetitions: int = 1
    seed: int = 1
    impairment: str = "auto"
    allow_missing_netem: bool = False
    timeout_s: float = 600.0
    collectors: Collectors = field(default_factory=Collectors)
    description: str = ""
    results_dir: str = "results"
    raw: dict[str, Any] = field(default_factory=dict)
    schedule: list[Any] = field(default_factory=list)  # traffic_control.schedule.LinkEvent, played per trial
    stall_s: float = 180.0  # a primary process without progress this long fails the trial (named)
    #: the sweep point this experiment is (``{param: value}``, SI units; empty outside a sweep)
    sweep_point: dict[str, Any] = field(default_factory=dict)

    @property
    def spec_hash(self) -> str:
        """Hash of the resolved spec: equal for a run and its rerun, different when the topology
        file behind a name changed (the network differs, so runs must not pool silently)."""
        same = {k: v for k, v in self.resolved().items() if k not in HASH_EXEMPT}
        return hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def resolved(self) -> dict[str, Any]:
        """The spec as a self-contained mapping: the topology inlined (with its ``scale``), so
        ``testbed rerun`` needs nothing but the manifest, even if the topology file changed."""
        out = copy.deepcopy(self.raw)
        out["topology"] = self.topology.to_dict()
        out.pop("scale", None)
        out["name"] = self.name
        out["repetitions"] = self.repetitions  # after a --repetitions override
        return out

    def workers(self) -> list[tuple[str, str]]:
        """(host, dc) of every trainer host in rank order."""
        plan = plan_network(self.topology)
        return [(n.name, n.dc) for n in plan.nodes.values() if n.role == "host"]


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "scheme":
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def parse_experiment(data: Any, source: str = "") -> ExperimentSpec:
    from ..training.config import validate_training

    if not isinstance(data, dict):
        raise ValidationError("experiment", "expected a mapping", "see README: experiment spec reference")
    check_keys(data, KEYS)
    name = data.get("name") or (Path(source).stem if source else "")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
        raise ValidationError("name", f"bad experiment name {name!r}", "use letters, digits, '_', '-', '.'")
    topo_raw = data.get("topology")
    if topo_raw is None:
        raise ValidationError("topology", "missing", "e.g. topology: three_dc_triangle")
    scale = data.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0):
        raise ValidationError("scale", f"scale must be a positive number, got {scale!r}", "e.g. scale: 0.5")
    try:
        if isinstance(topo_raw, dict):
            topo = from_dict(topo_raw, source=f"{source}#topology")
            if scale:
                topo = topo.scaled(float(scale))
        else:
            base = Path(source).parent if source else Path(".")
            cand = base / str(topo_raw)
            topo = load(str(cand) if cand.is_file() else str(topo_raw), scale=scale)
    except ValidationError as e:
        raise e.under("topology") from None
    imp = data.get("impairment", "auto")
    if imp not in IMPAIRMENTS:
        raise ValidationError("impairment", f"unknown backend {imp!r}", f"use one of: {', '.join(IMPAIRMENTS)}")
    amn = data.get("allow_missing_netem", False)
    if not isinstance(amn, bool):
        raise ValidationError("allow_missing_netem", "expected true/false", "allow_missing_netem: true")
    reps = data.get("repetitions", 1)
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValidationError("repetitions", f"expected a positive integer, got {reps!r}", "e.g. repetitions: 3")
    seed = data.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValidationError("seed", f"expected an integer, got {seed!r}", "e.g. seed: 1")
    timeout = parse_time(data.get("timeout", "600s"), "timeout")
    if timeout <= 0:
        raise ValidationError("timeout", "must be positive", "e.g. timeout: 10min")
    stall = parse_time(data.get("stall", f"{DEFAULT_STALL_S:g}s"), "stall")
    if stall < 1:
        raise ValidationError("stall", f"must be at least 1 s, got {stall:g} s",
                              "e.g. stall: 3min (a worker without progress that long fails the trial)")
    col_raw = data.get("collectors", {}) or {}
    if not isinstance(col_raw, dict):
        raise ValidationError("collectors", "expected a mapping", "e.g. collectors: {rate_hz: 10}")
    check_keys(col_raw, COLLECTOR_KEYS, "collectors")
    rate = col_raw.get("rate_hz", 10.0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1000:
        raise ValidationError("collectors.rate_hz", f"expected a rate in (0, 1000] Hz, got {rate!r}", "e.g. 10")
    for k in ("links", "procs", "trace"):
        if k in col_raw and not isinstance(col_raw[k], bool):
            raise ValidationError(f"collectors.{k}", "expected true/false", f"{k}: true")
    collectors = Collectors(float(rate), col_raw.get("links", True), col_raw.get("procs", True),
                            col_raw.get("trace", True))
    base_training = data.get("training", {}) or {}
    if not isinstance(base_training, dict):
        raise ValidationError("training", "expected a mapping", "see README: training section")
    raw_schemes = data.get("schemes")
    if raw_schemes is None:
        raw_schemes = [base_training.get("scheme", {"name": "bsp"})]
    if not isinstance(raw_schemes, list) or not raw_schemes:
        raise ValidationError("schemes", "expected a non-empty list", "e.g. schemes: [bsp, asp, gsyn]")
    spec = ExperimentSpec(name, topo, [], reps, seed, imp, amn, timeout, collectors,
                          str(data.get("description", "")), str(data.get("results_dir", "results")), data)
    spec.stall_s = stall
    if data.get("schedule"):
        from traffic_control.schedule import load_schedule

        sched = Path(source).parent / str(data["schedule"]) if source else Path(str(data["schedule"]))
        try:
            spec.schedule = load_schedule(sched)
        except ValidationError as e:
            raise e.under("schedule") from None
        from ..network.emulation import Impairment, check_schedule

        check_schedule(topo, spec.schedule, Impairment("none", False) if imp == "none" else None)
    workers = spec.workers()
    labels: set[str] = set()
    for i, entry in enumerate(raw_schemes):
        f = f"schemes[{i}]"
        if isinstance(entry, str):
            entry = {"label": entry, "scheme": {"name": entry}}
        if not isinstance(entry, dict):
            raise ValidationError(f, "expected a scheme name or a mapping", "e.g. {label: ssp2, scheme: {name: ssp, staleness: 2}}")
        check_keys(entry, ("label", "scheme", "training"), f)
        scheme = entry.get("scheme")
        if isinstance(scheme, str):
            scheme = {"name": scheme}
        if not isinstance(scheme, dict) or "name" not in scheme:
            raise ValidationError(f"{f}.scheme", "expected {name: ...}", "e.g. scheme: {name: gsyn}")
        label = entry.get("label") or scheme["name"]
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", label):
            raise ValidationError(f"{f}.label", f"bad label {label!r}", "letters, digits, '_', '-', '.'")
        if label in labels:
            raise ValidationError(f"{f}.label", f"duplicate label {label!r}", "give each compared scheme a unique label")
        labels.add(label)
        over = entry.get("training", {}) or {}
        if not isinstance(over, dict):
            raise ValidationError(f"{f}.training", "expected a mapping", "training overrides, e.g. {stop: {steps: 50}}")
        training = _deep_merge(base_training, over)
        training["scheme"] = scheme
        try:
            validate_training(training, workers, field="training")
        except ValidationError as e:
            raise ValidationError(f"{f}.{e.field}" if not e.field.startswith("training") else f"{f}.{e.field}",
                                  e.problem, e.fix) from None
        spec.schemes.append(SchemeRun(label, training))
    return spec


def load_experiment(path: str | Path) -> ExperimentSpec:
    p = Path(path)
    if not p.is_file():
        bundled = Path(__file__).resolve().parent / "bundled" / f"{path}.yaml"
        if bundled.is_file():
            p = bundled
        else:
            raise ValidationError("experiment", f"no file {str(path)!r}", "give the path of an experiment YAML")
    return parse_experiment(read_mapping(p), source=str(p))
