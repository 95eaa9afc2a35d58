"""The exported JSON Schema and the loaders agree: every key the loaders accept is in the schema,
and nothing else is.

The walk: every object the exported experiment schema describes (the experiment, its topology,
training and each registered workload's and scheme's parameters, the scheme entries) is found in
one maximal spec; an unknown key is put there and the *loader* must refuse exactly that key, at
exactly that path, listing as valid keys exactly the schema's properties.  Every bundled spec
validates against the schema and loads.  A new field that reaches only one of the two fails here.
"""

from __future__ import annotations

import copy
import glob
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema")

from testbed.experiments.spec import parse_experiment  # noqa: E402
from testbed.experiments.sweep import expand  # noqa: E402
from testbed.planning.model import Plan  # noqa: E402
from testbed.spec_schema import KINDS, schema  # noqa: E402
from testbed.training.schemes import SCHEMES  # noqa: E402
from testbed.training.workloads import WORKLOADS  # noqa: E402
from topologies import load  # noqa: E402
from traffic_control.errors import ValidationError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
UNKNOWN = "zz_not_a_key"

GE = {"p": "1%", "r": "20%", "loss_bad": "50%", "loss_good": "0%"}
TOPOLOGY = {
    "name": "t", "description": "d", "scale": 1.0, "switch": "bridge",
    "defaults": {"hosts": 1, "lan": {"rate": "1Gbit", "gilbert_elliott": dict(GE)}, "wan": {"rate": "100Mbit", "gilbert_elliott": dict(GE)}, "cpu": 1.0, "memory": "1GiB",
                 "tcp": {"congestion_control": "cubic"}},
    "dcs": [{"name": "a", "hosts": 1, "lan": {"rate": "1Gbit", "gilbert_elliott": dict(GE)}, "cpu": 1.0, "memory": "1GiB", "label": "x",
             "tcp": {"congestion_control": "reno"}},
            {"name": "b", "hosts": 1}],
    "links": [{"a": "a", "b": "b", "rate": "10Mbit", "gilbert_elliott": dict(GE), "forward": {"delay": "1ms", "gilbert_elliott": dict(GE)},
               "reverse": {"delay": "2ms", "gilbert_elliott": dict(GE)}}],
    "ps": "a", "routes": {},
}
TRAINING = {
    "workload": {"name": "digits"}, "scheme": {"name": "bsp"},
    "optimizer": {"name": "sgd", "lr": 0.1}, "stop": {"steps": 5, "target": {"metric": "loss", "value": 1.0},
                                                  "give_up": {"metric": "loss", "value": 2.0, "after_s": 5}},
    "slowdown": [{"hosts": ["a-h1"], "factor": 1.5, "delay": {"dist": "constant", "value_s": "10ms"}}],
    "fault": {"step": 3, "rank": 0},
    "compute": {"mode": "emulated", "time_scale": 0.5, "factor_by_dc": {"a": 1.5}, "cv": 0.05,
                "pad_gradient": True, "gradient_dtype": "fp16",
                "profile": {"name": "tiny", "model": "m", "gpu": "g", "batch_size": 8, "throughput": 100.0,
                            "params": 1000, "source": "test", "precision": "fp32", "unit": "images", "url": ""}},
}
EXPERIMENT = {
    "name": "e", "topology": TOPOLOGY, "collectors": {"rate_hz": 5}, "training": TRAINING,
    "schemes": [{"label": "x", "scheme": {"name": "bsp"},
                 "training": {k: copy.deepcopy(v) for k, v in TRAINING.items() if k not in ("workload", "scheme")}}],
    "lr_search": {"values": {"low": 0.01, "high": 1.0, "count": 4}, "seed": 1001, "steps": 5, "wall_s": "10s",
                  "target": {"metric": "loss", "value": 1.0}, "schemes": ["x"],
                  "give_up": {"metric": "loss", "value": 2.0, "after_s": "5s"}},
    # a profile (the walker meets both profile variants at this path, diurnal last; netstorm's keys:
    # tests/unit/test_profiles.py)
    "schedule": {"profile": "diurnal", "period": "60s", "low": 0.5, "step": "10s", "duration": "30s",
                 "phase_per_link": "5s", "links": ["a-b"]},
    "cross_traffic": [{"from": "a", "to": "b", "pattern": "constant", "rate": "1Mbit", "label": "bg"}],
}
# parameters that a variant needs to be valid at all (pgcs needs the experts workload)
VARIANT_NEEDS: dict[tuple[str, str], dict[str, Any]] = {
    ("scheme", "pgcs"): {"workload": {"name": "experts", "experts": 2}},
    ("scheme", "ddp_overlap"): {"workload": {"name": "experts", "experts": 2}},
}


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].split("/")[-1]
        node = {**root["$defs"][name], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _objects(node: Any, root: dict[str, Any], path: tuple[Any, ...], out: dict[tuple[Any, ...], set[str]],
             seen: frozenset[str] = frozenset()) -> None:
    """Every object with properties in the schema, by path ('*' for list items, variant names
    for workload/scheme alternatives)."""
    if not isinstance(node, dict):
        return
    ref = node.get("$ref")
    if ref in seen:
        return
    node = _resolve(node, root)
    seen = seen | ({ref} if ref else set())
    for alt in node.get("anyOf", []) + node.get("oneOf", []):
        a = _resolve(alt, root)
        const = a.get("properties", {}).get("name", {}).get("const")
        _objects(a, root, path + ((const,) if const else ()), out, seen)
    if node.get("type") == "array" or "items" in node:
        _objects(node.get("items", {}), root, path + ("*",), out, seen)
    props = node.get("properties")
    if isinstance(props, dict):
        out[path] = set(props)
        for key, sub in props.items():
            _objects(sub, root, path + (key,), out, seen)


def _locate(spec: Any, path: tuple[Any, ...]) -> tuple[Any, str] | None:
    """The mapping at ``path`` in ``spec`` and its loader path, or None if the spec lacks it."""
    cur, where = spec, ""
    for part in path:
        if part == "*":
            if not isinstance(cur, list) or not cur:
                return None
            cur, where = cur[0], f"{where}[0]"
        elif isinstance(cur, dict) and part in cur and isinstance(cur[part], dict | list):
            cur, where = cur[part], f"{where}.{part}" if where else part
        elif isinstance(cur, dict) and cur.get("name") == part:  # a workload/scheme variant
            continue
        else:
            return None
    return (cur, where) if isinstance(cur, dict) else None


def _variant_spec(kind: str, name: str) -> dict[str, Any]:
    spec = copy.deepcopy(EXPERIMENT)
    spec["training"][kind] = {"name": name}
    spec["training"].update(copy.deepcopy(VARIANT_NEEDS.get((kind, name), {})))
    del spec["schemes"]  # the training's own scheme is the one compared
    return spec


def _accepted_keys(fix: str) -> set[str]:
    if fix == "it takes no keys here; remove it":
        return set()
    assert fix.startswith("use one of: "), fix
    return {k.strip() for k in fix.removeprefix("use one of: ").split(",")}


@pytest.mark.parametrize("kind", KINDS)
def test_every_exported_schema_is_valid_json_schema(kind: str) -> None:
    jsonschema.Draft202012Validator.check_schema(schema(kind))


def test_schema_keys_are_exactly_the_keys_the_loader_accepts() -> None:
    root = schema("experiment")
    objects: dict[tuple[Any, ...], set[str]] = {}
    _objects(root, root, (), objects)
    assert len(objects) > 30, sorted(objects)
    checked, missing = 0, []
    for path, props in sorted(objects.items(), key=str):
        variant = next(((k, p) for k, p in zip(path, path[1:], strict=False)
                        if k in ("workload", "scheme") and isinstance(p, str) and p not in ("*",)
                        and (p in WORKLOADS.names() or p in SCHEMES.names())), None)
        base = _variant_spec(*variant) if variant else EXPERIMENT
        if path[:1] == ("schemes",) and variant:  # a scheme entry's variants: the same as training's
            continue
        found = _locate(copy.deepcopy(base), path)
        if found is None:
            missing.append(path)
            continue
        spec = copy.deepcopy(base)
        target, where = _locate(spec, path)  # type: ignore[misc]
        target[UNKNOWN] = 1
        with pytest.raises(ValidationError) as e:
            parse_experiment(spec)
        err = e.value
        assert err.field.endswith(f"{where}.{UNKNOWN}" if where else UNKNOWN), (path, str(err))
        assert err.problem == "unknown key", (path, str(err))
        own = {"name"} if variant and path[-1] == variant[1] else set()  # the name selects, it is no parameter
        keys = _accepted_keys(err.fix) - own
        assert keys == props - own, (path, sorted(keys ^ (props - own)))
        checked += 1
    assert not missing, f"extend the maximal spec of this test to reach: {missing}"
    assert checked >= len(WORKLOADS.names()) + len(SCHEMES.names()) + 15


def test_bundled_specs_validate_against_the_schema_and_load() -> None:
    topo_v = jsonschema.Draft202012Validator(schema("topology"))
    for f in sorted(glob.glob(str(REPO / "topologies" / "*.yaml"))):
        assert not list(topo_v.iter_errors(yaml.safe_load(Path(f).read_text()))), f
        load(f)
    exp_v = jsonschema.Draft202012Validator(schema("experiment"))
    files = glob.glob(str(REPO / "testbed/experiments/bundled/*.yaml")) + glob.glob(str(REPO / "benchmarks/*.yaml"))
    assert len(files) >= 4
    sweep_v = jsonschema.Draft202012Validator(schema("sweep"))
    for f in sorted(files):
        data = yaml.safe_load(Path(f).read_text())
        is_sweep = "grid" in data
        errors = [f"{list(x.absolute_path)}: {x.message[:120]}" for x in (sweep_v if is_sweep else exp_v).iter_errors(data)]
        assert not errors, (f, errors[:3])
        expand(data, f) if is_sweep else parse_experiment(data, source=f)
    sweep = {"name": "s", "experiment": "demo_reduced.yaml", "grid": {"wan.rate": ["20Mbit"], "seed": [1, 2]}}
    assert not list(sweep_v.iter_errors(sweep))
    expand(sweep, str(REPO / "testbed/experiments/bundled/sweep.yaml"))
    assert list(sweep_v.iter_errors(dict(sweep, metric="throughput")))  # the schema refuses what the loader does


def test_plan_files_written_by_the_planner_validate() -> None:
    from testbed.planning.solver import plan_blp

    topo = load("three_dc_triangle")
    plan = plan_blp(topo.dc_graph(), 10**6)
    data = json.loads(plan.to_json())
    assert not list(jsonschema.Draft202012Validator(schema("plan")).iter_errors(data))
    assert Plan.from_dict(data).trees == plan.trees


def test_schema_command_prints_and_writes(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "schema", "topology"], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["title"] == "geo-testbed topology spec"
    out = tmp_path / "experiment.schema.json"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "schema", "experiment", "--out", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0 and "scheme" in json.dumps(json.loads(out.read_text()))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "schema", "nonsense"], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 2


def test_sweep_keys_are_the_schemas() -> None:
    props = set(schema("sweep")["properties"])
    with pytest.raises(ValidationError) as e:
        expand({"experiment": copy.deepcopy(EXPERIMENT), "grid": {"seed": [1]}, UNKNOWN: 1})
    assert e.value.field == UNKNOWN and _accepted_keys(e.value.fix) == props
