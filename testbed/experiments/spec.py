"""The experiment spec: one YAML file for a whole comparison.

```yaml
name: demo                      # results/<name>/<run-id>/
extends: base.yaml              # optional: start from another spec file (resolve_extends)
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
collectors: {rate_hz: 10, links: true, procs: true, tcp: true}
lr_search: {values: {low: 0.01, high: 1, count: 5}, seed: 1001, steps: 40}   # optional, see lr_search
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
from typing import Any, Literal

from topologies import Topology, from_dict, load
from topologies.loader import read_mapping
from traffic_control.errors import ValidationError
from traffic_control.fields import Duration, SpecModel, unit_field, validate
from traffic_control.profiles import DiurnalSpec, NetstormSpec, ScheduleSpec

from ..network.addressing import plan_network
from ..network.cross_traffic import CrossFlowSpec, parse_cross_traffic
from ..network.emulation import IMPAIRMENTS
from .lr_search import LrSearch, LrSearchSpec, parse_lr_search

#: a worker without progress this long (no span, and no CPU time before its first) fails its trial
DEFAULT_STALL_S = 180.0

#: keys that do not change what a trial is (how many, where stored, prose): not hashed
HASH_EXEMPT = ("repetitions", "results_dir", "description")


@dataclass
class SchemeRun:
    label: str
    training: dict[str, Any]
    #: where training.optimizer.lr came from (the trial manifest's lr_provenance); None = as given
    lr_provenance: dict[str, Any] | None = None


@dataclass
class Collectors:
    rate_hz: float = 10.0
    links: bool = True
    procs: bool = True
    trace: bool = True
    tcp: bool = True


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
    #: the per-scheme lr search run before the trials (None: none asked for)
    lr_search: LrSearch | None = None
    #: background flows sharing the WAN during every trial (testbed.network.cross_traffic.CrossFlow)
    cross_traffic: list[Any] = field(default_factory=list)
    #: the servers the trials span (testbed.cluster.model.Cluster, from ``run --cluster FILE``; not part of the
    #: spec: the same spec runs on one machine or several); None: this machine
    cluster: Any = None

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


_LABEL = r"^[A-Za-z0-9_.-]+$"


class CollectorsSpec(SpecModel):
    """What is sampled during each trial."""

    rate_hz: float = unit_field(10.0, gt=0, le=1000, fix="e.g. rate_hz: 10")
    """link and process samples per second"""
    links: bool = True
    """sample every WAN and LAN interface's counters and qdisc stats"""
    procs: bool = True
    """sample every training process's CPU and memory"""
    tcp: bool = True
    """sample every host's TCP connections: cwnd, RTT, retransmissions (socket diagnostics)"""
    trace: bool = True
    """merge spans and samples into trace.json (Perfetto)"""


class SchemeEntrySpec(SpecModel):
    """One compared scheme: its label, its scheme section, and overrides of the base training."""

    label: str | None = unit_field(None, pattern=_LABEL, fix="letters, digits, '_', '-', '.'")
    """results label (default: the scheme's name); unique in the experiment"""
    scheme: str | dict[str, Any] = unit_field(..., fix="e.g. scheme: {name: gsyn}")
    """a scheme name, or {name: ..., params...} (the training section's scheme)"""
    training: dict[str, Any] = unit_field(default_factory=dict, fix="training overrides, e.g. {stop: {steps: 50}}")
    """overrides of the experiment's training section for this scheme (merged key by key)"""


class ExperimentSpecModel(SpecModel):
    """An experiment: one topology, every scheme x repetition on a fresh network (README "Experiments")."""

    name: str | None = unit_field(None, pattern=_LABEL, fix="use letters, digits, '_', '-', '.'")
    """results go to results/<name>/<run-id>/ (default: the file name; never inherited through extends)"""
    extends: str | None = unit_field(None, fix="e.g. extends: gsyn_3dc_lr_search.yaml (a path relative to this file)")
    """another experiment file (relative to this one) this one starts from: mappings merge key by key,
    anything else (a list such as schemes:, a value, a scheme section) replaces the base's"""
    description: str = ""
    topology: str | dict[str, Any] = unit_field(..., fix="e.g. topology: three_dc_triangle")
    """bundled name, a path (relative to the spec), or an inline topology mapping"""
    scale: float | None = unit_field(None, gt=0, fix="e.g. scale: 0.5")
    """multiplies every WAN rate of the topology (recorded)"""
    impairment: Literal[IMPAIRMENTS] = unit_field("auto", fix=f"use one of: {', '.join(IMPAIRMENTS)}")  # type: ignore[valid-type]
    """how delay, jitter and loss are realised (as for net up)"""
    allow_missing_netem: bool = False
    """run with delay/jitter/loss skipped (recorded) when no backend can realise them"""
    repetitions: int = unit_field(1, ge=1, fix="e.g. repetitions: 3")
    """trials per scheme, each on a fresh network"""
    seed: int = unit_field(1, fix="e.g. seed: 1")
    """repetition r uses seed + r (training and the impairment's random draws)"""
    timeout: Duration = unit_field(600.0, gt=0, fix="e.g. timeout: 10min")
    """per trial; then it is stopped and marked timeout"""
    stall: Duration = unit_field(DEFAULT_STALL_S, ge=1,
                                 fix="e.g. stall: 3min (a worker without progress that long fails the trial)")
    """a worker without progress this long (hung, SIGSTOPped, blocked on a dead peer) fails the trial"""
    training: dict[str, Any] = unit_field(default_factory=dict, fix="see README: training section")
    """the base training section (workload, scheme, stop, optimizer, ...)"""
    schemes: list[str | SchemeEntrySpec] | None = unit_field(None, min_length=1,
                                                             fix="e.g. schemes: [bsp, asp, gsyn]")
    """what to compare; each entry overrides training (default: the training's scheme)"""
    collectors: CollectorsSpec = unit_field(default_factory=CollectorsSpec, fix="e.g. collectors: {rate_hz: 10}")
    results_dir: str = "results"
    """results root"""
    schedule: ScheduleSpec = unit_field(
        None, fix="a link schedule file relative to the spec, or a profile: {profile: netstorm, every: 10s, "
                  "range: [0.2, 1.0], duration: 10min, seed: 1}")
    """link events played during every trial: a schedule file (traffic_control.schedule) or a generated
    time-varying profile (traffic_control.profiles: netstorm, diurnal)"""
    lr_search: LrSearchSpec | None = unit_field(None, fix="e.g. lr_search: {values: {low: 0.01, high: 1, count: 5}}")
    """per-scheme learning-rate search on a separate seed before the trials (README "Learning rates")"""
    cross_traffic: list[CrossFlowSpec] | None = unit_field(
        None, fix="e.g. cross_traffic: [{from: a, to: b, pattern: constant, rate: 20Mbit}]")
    """background flows sharing the WAN during every trial (README "Cross traffic")"""


KEYS = tuple(ExperimentSpecModel.model_fields)
COLLECTOR_KEYS = tuple(CollectorsSpec.model_fields)


def rebase_files(data: dict[str, Any], origin: Path, here: Path) -> dict[str, Any]:
    """A copy of an experiment mapping written in folder ``origin``, to be read as if it lay in ``here``.

    The spec's relative ``topology:`` and ``schedule:`` files are resolved against the spec's folder;
    a mapping taken from another folder (a base it ``extends``, a sweep's ``experiment:`` file) would
    look for them in the wrong one, so those that exist beside ``origin`` become absolute paths.
    """
    out = dict(data)
    if origin.resolve() == here.resolve():
        return out
    for key in ("topology", "schedule"):
        val = out.get(key)
        if isinstance(val, str) and (origin / val).is_file():
            out[key] = str((origin / val).resolve())
    return out


def resolve_extends(data: Any, source: str = "", _chain: tuple[Path, ...] = ()) -> Any:
    """The experiment mapping with its ``extends:`` chain merged in (the mapping itself when it has none).

    Why: two comparisons that differ in one field (a straggler's slowdown, the searched schemes) were
    kept as two whole copies that drifted apart.  The base's relative ``topology:`` and ``schedule:``
    files are rewritten relative to this file, so a base in another folder still finds its own; the
    base's ``name`` is dropped (a child without one is named after its own file, never writing into
    the base's results folder).  What runs, and what a run records (``resolved_spec``), is the merged
    mapping: a later edit of the base changes the hash of a sweep point that extends it.
    """
    if not isinstance(data, dict) or "extends" not in data:
        return data
    ref = data["extends"]
    if not isinstance(ref, str) or not ref:
        raise ValidationError("extends", f"expected a file path, got {ref!r}",
                              "e.g. extends: gsyn_3dc_lr_search.yaml (relative to this file)")
    here = Path(source).resolve().parent if source else Path.cwd()
    base_path = (here / ref).resolve()
    if not base_path.is_file():
        raise ValidationError("extends", f"no experiment file {ref!r} (looked for {base_path})",
                              "give a path relative to the file that extends it")
    chain = (*_chain, Path(source).resolve()) if source else _chain
    if base_path in chain:
        names = " -> ".join(p.name for p in (*chain, base_path))
        raise ValidationError("extends", f"a cycle: {names}", "make one of these files stop extending the other")
    try:
        base = resolve_extends(read_mapping(base_path), str(base_path), chain)
    except ValidationError as e:
        raise ValidationError(f"extends ({ref}): {e.field}", e.problem, e.fix) from None
    if not isinstance(base, dict):
        raise ValidationError("extends", f"{ref!r} is not an experiment mapping", "extend an experiment YAML")
    base = rebase_files(base, base_path.parent, here)
    base.pop("name", None)
    over = {k: v for k, v in data.items() if k != "extends"}
    return _deep_merge(base, over)


def parse_experiment(data: Any, source: str = "") -> ExperimentSpec:
    from ..training.config import validate_training

    if not isinstance(data, dict):
        raise ValidationError("experiment", "expected a mapping", "see README: experiment spec reference")
    m = validate(ExperimentSpecModel, data)
    if m.extends is not None:
        raise ValidationError("extends", "unresolved: this mapping was not read from its file",
                              "pass the file's path (load_experiment), or call resolve_extends(mapping, source) first")
    name = m.name or (Path(source).stem if source else "")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
        raise ValidationError("name", f"bad experiment name {name!r}", "use letters, digits, '_', '-', '.'")
    topo_raw, scale = m.topology, m.scale
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
    imp, amn, reps, seed, timeout, stall = m.impairment, m.allow_missing_netem, m.repetitions, m.seed, m.timeout, m.stall
    c = m.collectors
    collectors = Collectors(float(c.rate_hz), c.links, c.procs, c.trace, c.tcp)
    base_training = m.training
    raw_schemes: list[Any] = list(m.schemes) if m.schemes is not None else [
        base_training.get("scheme", {"name": "bsp"})]
    spec = ExperimentSpec(name, topo, [], reps, seed, imp, amn, timeout, collectors, m.description,
                          m.results_dir, data)
    spec.stall_s = stall
    if isinstance(m.schedule, (NetstormSpec, DiurnalSpec)):
        from traffic_control.profiles import generate

        spec.schedule = generate(topo, m.schedule, "schedule")
    elif data.get("schedule"):
        from traffic_control.schedule import load_schedule

        sched = Path(source).parent / str(data["schedule"]) if source else Path(str(data["schedule"]))
        try:
            spec.schedule = load_schedule(sched)
        except ValidationError as e:
            raise e.under("schedule") from None
    spec.cross_traffic = parse_cross_traffic(data.get("cross_traffic"), topo.dc_names)
    if spec.schedule:
        from ..network.emulation import Impairment, check_schedule

        check_schedule(topo, spec.schedule, Impairment("none", False) if imp == "none" else None)
    workers = spec.workers()
    if "workload" in base_training:  # the base section on its own: a mistake in a part every scheme
        first = raw_schemes[0]      # overrides (a replaced slowdown: list) is still a mistake
        first = first if isinstance(first, str | dict) else first.scheme
        try:
            validate_training(dict(base_training, scheme=first), workers, field="training")
        except ValidationError as e:
            if not e.field.startswith("training.scheme"):  # the scheme's own errors are the entry's
                raise
    labels: set[str] = set()
    for i, entry in enumerate(raw_schemes):
        f = f"schemes[{i}]"
        if isinstance(entry, str):
            entry = SchemeEntrySpec(label=entry, scheme={"name": entry})
        elif isinstance(entry, dict):  # the training's own scheme section (no schemes: list)
            entry = SchemeEntrySpec(scheme=entry)
        scheme = entry.scheme
        if isinstance(scheme, str):
            scheme = {"name": scheme}
        if "name" not in scheme:
            raise ValidationError(f"{f}.scheme.name", "missing", "e.g. scheme: {name: gsyn}")
        label = entry.label or scheme["name"]
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", label):
            raise ValidationError(f"{f}.label", f"bad label {label!r}", "letters, digits, '_', '-', '.'")
        if label in labels:
            raise ValidationError(f"{f}.label", f"duplicate label {label!r}", "give each compared scheme a unique label")
        labels.add(label)
        # Errors name where the mistake is written: the base `training:` section, the entry's
        # `scheme:` (or training.scheme when there is no schemes: list), or the entry's overrides.
        scheme_at = f"{f}.scheme" if m.schemes is not None else "training.scheme"

        def named(e: ValidationError, where: str, scheme_at: str = scheme_at) -> ValidationError:
            if e.field == "training.scheme" or e.field.startswith(("training.scheme.", "training.scheme[")):
                return ValidationError(scheme_at + e.field[len("training.scheme"):], e.problem, e.fix)
            return ValidationError(where + e.field[len("training"):], e.problem, e.fix)

        training = _deep_merge(base_training, entry.training)
        training["scheme"] = scheme
        try:
            validate_training(training, workers, field="training")
        except ValidationError as e:
            try:  # the same mistake without this entry's overrides: it is in the base section
                validate_training(dict(base_training, scheme=scheme), workers, field="training")
            except ValidationError as base_e:
                if base_e.field == e.field:
                    raise named(base_e, "training") from None
            raise named(e, f"{f}.training") from None
        if training.get("backend") == "nccl":
            from ..network.gpus import check_nccl

            check_nccl(topo, workers, f"{f}.training.backend" if "backend" in (entry.training or {})
                       else "training.backend")
        spec.schemes.append(SchemeRun(label, training))
    spec.lr_search = parse_lr_search(m.lr_search, seed, reps, [s.label for s in spec.schemes])
    return spec


def load_experiment(path: str | Path) -> ExperimentSpec:
    p = Path(path)
    if not p.is_file():
        bundled = Path(__file__).resolve().parent / "bundled" / f"{path}.yaml"
        if bundled.is_file():
            p = bundled
        else:
            raise ValidationError("experiment", f"no file {str(path)!r}", "give the path of an experiment YAML")
    return parse_experiment(resolve_extends(read_mapping(p), str(p)), source=str(p))
