"""JSON Schema of every spec, built from the pydantic models the loaders validate with.

``testbed schema KIND`` prints one of: ``topology``, ``experiment``, ``sweep``,
``training``, ``plan``.  Editors use it to complete and check YAML (e.g. a
``# yaml-language-server: $schema=experiment.schema.json`` first line).

The schema is assembled, not written: each part comes from the model that
validates it (``topologies.model.TopologySpec``, the training dataclasses'
mirrors, ``ExperimentSpecModel``, ``SweepSpec``, ``PlanSpec``), and the
training section's ``workload`` and ``scheme`` are one variant per registered
name (built-ins, installed entry points), each with that entry's parameters,
so a key the loaders accept is in the schema and nothing else is
(``tests/unit/test_spec_schema.py`` walks both).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import TypeAdapter

KINDS = ("topology", "experiment", "sweep", "training", "plan")
DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _Defs:
    """One ``$defs`` table for a schema assembled from several models (names kept unique)."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def add(self, schema: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        """``schema`` with its own ``$defs`` moved into the table (renamed under ``prefix``)."""
        schema = copy.deepcopy(schema)
        local = schema.pop("$defs", {})
        renames = {name: self._unique(prefix + name, local[name]) for name in local}

        def fix(node: Any) -> Any:
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in renames:
                    node = dict(node, **{"$ref": f"#/$defs/{renames[ref[8:]]}"})
                mapping = node.get("discriminator", {}).get("mapping") if isinstance(node.get("discriminator"),
                                                                                       dict) else None
                if isinstance(mapping, dict):  # a tagged union names its members by reference too
                    node = dict(node, discriminator=dict(node["discriminator"], mapping={
                        tag: f"#/$defs/{renames[r[8:]]}" if isinstance(r, str) and r[8:] in renames else r
                        for tag, r in mapping.items()}))
                return {k: fix(v) for k, v in node.items()}
            if isinstance(node, list):
                return [fix(v) for v in node]
            return node

        for name, body in local.items():
            self.defs[renames[name]] = fix(body)
        return fix(schema)

    def _unique(self, name: str, body: Any) -> str:
        cand, k = name, 2
        while cand in self.defs and self.defs[cand] != body:
            cand, k = f"{name}{k}", k + 1
        return cand


def _model_schema(model: Any) -> dict[str, Any]:
    return TypeAdapter(model).json_schema()


def _named_variants(registry: Any, defs: _Defs, kind: str) -> dict[str, Any]:
    """``workload:`` / ``scheme:``: a name, or ``{name: NAME, **that entry's parameters}``."""
    from testbed.training.schema import mirror

    variants: list[dict[str, Any]] = []
    names = registry.names()
    for name in names:
        entry = registry.entry(name)
        params = defs.add(_model_schema(mirror(entry.params)), prefix=f"{kind}_{name}_")
        props = {"name": {"const": name, "description": entry.doc or name}, **params.get("properties", {})}
        variants.append({"type": "object", "title": f"{kind} {name}", "description": entry.params.__doc__ or "",
                         "properties": props, "required": ["name", *params.get("required", [])],
                         "additionalProperties": False})
    return {"anyOf": [{"type": "string", "enum": names, "description": f"a {kind} with default parameters"},
                      *variants],
            "description": f"{kind}: one of {', '.join(names)} (or an installed geo_testbed.{kind}s entry point)"}


def _training(defs: _Defs, partial: bool = False) -> dict[str, Any]:
    from testbed.training.config import TrainingConfig
    from testbed.training.schema import mirror
    from testbed.training.schemes import SCHEMES
    from testbed.training.workloads import WORKLOADS

    body = defs.add(_model_schema(mirror(TrainingConfig)), prefix="training_")
    body["properties"]["workload"] = _named_variants(WORKLOADS, defs, "workload")
    body["properties"]["scheme"] = _named_variants(SCHEMES, defs, "scheme")
    if partial:  # an override (schemes[i].training) or a base the schemes complete
        body.pop("required", None)
    return body


def _topology(defs: _Defs) -> dict[str, Any]:
    from topologies.model import TopologySpec

    return defs.add(_model_schema(TopologySpec), prefix="topology_")


def _experiment(defs: _Defs) -> dict[str, Any]:
    from testbed.experiments.spec import ExperimentSpecModel, SchemeEntrySpec

    body = defs.add(_model_schema(ExperimentSpecModel), prefix="experiment_")
    props = body["properties"]
    topo = _topology(defs)
    defs.defs.setdefault("Topology", topo)
    props["topology"] = {"anyOf": [{"type": "string", "description": "bundled name or a path"},
                                   {"$ref": "#/$defs/Topology"}], "description": props["topology"].get("description")}
    defs.defs.setdefault("TrainingPartial", _training(defs, partial=True))
    props["training"] = {"$ref": "#/$defs/TrainingPartial"}
    entry = defs.add(_model_schema(SchemeEntrySpec), prefix="entry_")
    from testbed.training.schemes import SCHEMES

    entry["properties"]["scheme"] = _named_variants(SCHEMES, defs, "scheme")
    entry["properties"]["training"] = {"$ref": "#/$defs/TrainingPartial"}
    defs.defs["SchemeEntry"] = entry
    props["schemes"] = {"anyOf": [{"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "string", "enum": SCHEMES.names()}, {"$ref": "#/$defs/SchemeEntry"}]}}, {"type": "null"}],
        "description": props["schemes"].get("description")}
    return body


def _sweep(defs: _Defs) -> dict[str, Any]:
    from testbed.experiments.sweep import SweepSpec

    body = defs.add(_model_schema(SweepSpec), prefix="sweep_")
    defs.defs.setdefault("Experiment", _experiment(defs))
    body["properties"]["experiment"] = {"anyOf": [{"type": "string", "description": "path relative to the sweep"},
                                                  {"$ref": "#/$defs/Experiment"}]}
    return body


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema document of spec ``kind`` (one of :data:`KINDS`)."""
    defs = _Defs()
    if kind == "topology":
        body = _topology(defs)
    elif kind == "experiment":
        body = _experiment(defs)
    elif kind == "sweep":
        body = _sweep(defs)
    elif kind == "training":
        body = _training(defs)
    elif kind == "plan":
        from testbed.planning.model import PlanSpec

        body = defs.add(_model_schema(PlanSpec), prefix="plan_")
    else:
        raise ValueError(f"unknown spec kind {kind!r}; one of {', '.join(KINDS)}")
    out = {"$schema": DIALECT, **body, "title": f"geo-testbed {kind} spec"}
    if defs.defs:
        out["$defs"] = defs.defs
    return out


def register(sub: Any) -> None:
    """``testbed schema KIND [--out FILE]`` (CLI plug-in contract of docs/CONTRACTS.md)."""
    import argparse

    p = sub.add_parser("schema", help="print the JSON Schema of a spec kind (for editors: completion and checks)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=KINDS, help="which spec")
    p.add_argument("--out", help="write it to this file instead of stdout")
    p.set_defaults(func=_cmd)


def _cmd(args: Any) -> int:
    import json
    import sys
    from pathlib import Path

    text = json.dumps(schema(args.kind), indent=2) + "\n"
    if args.out:
        from traffic_control.files import write_atomic

        write_atomic(Path(args.out), text)
        print(f"{args.kind} schema: {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
