"""Loading topologies from bundled names, YAML/JSON files, or Python files.

A Python topology file builds the model through the API and exposes either a
``topology()`` function or a ``TOPOLOGY`` object (a :class:`Topology` or a
spec mapping), so a topology can be computed (e.g. a generated mesh).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import yaml

from traffic_control.errors import ValidationError

from .model import Topology, from_dict

BUNDLED_DIR = Path(__file__).resolve().parent


def bundled() -> list[str]:
    """Names of the topologies shipped with the package."""
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.yaml"))


def resolve(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.is_file():
        return p
    cand = BUNDLED_DIR / f"{name_or_path}.yaml"
    if cand.is_file():
        return cand
    raise ValidationError("topology", f"no topology file or bundled topology named {name_or_path!r}",
                          f"give a path, or one of: {', '.join(bundled())}")


def load(name_or_path: str | Path | Topology, *, scale: float | None = None) -> Topology:
    """A validated :class:`Topology` from a bundled name, a .yaml/.yml/.json or a .py file."""
    if isinstance(name_or_path, Topology):
        topo = name_or_path
    else:
        path = resolve(str(name_or_path))
        suffix = path.suffix.lower()
        if suffix == ".py":
            topo = _load_python(path)
        else:
            topo = from_dict(read_mapping(path), source=str(path))
    if scale is not None and scale != 1.0:
        topo = topo.scaled(scale)
    return topo


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a mapping with a duplicate key is an error.

    PyYAML keeps the last of two equal keys silently, so a spec with ``rate:`` twice
    would run with whichever came last; every spec file goes through this loader.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"a key must be a plain value, not {type(key).__name__} {key!r}", key_node.start_mark) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"duplicate key {key!r} (first at line {seen[key].line + 1}); keep one", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}; keep one")
        out[k] = v
    return out


def parse_text(text: str, source: str = "", as_json: bool = False) -> Any:
    """Parse spec text (YAML, or JSON), rejecting duplicate keys; errors are ValidationErrors."""
    try:
        if as_json:
            return json.loads(text, object_pairs_hook=_no_duplicates)
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ValidationError(source or "spec", f"not valid YAML: {where}{e.problem or e.context}",
                              "fix the file there") from None
    except (yaml.YAMLError, ValueError) as e:
        raise ValidationError(source or "spec", f"not valid {'JSON' if as_json else 'YAML'}: {e}",
                              "fix the file") from None


def read_mapping(path: Path) -> Any:
    """Parse a YAML or JSON file (duplicate keys are errors), errors as ValidationError."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ValidationError(str(path), f"cannot read: {e.strerror}", "check the path") from None
    return parse_text(text, str(path), as_json=path.suffix.lower() == ".json")


def _load_python(path: Path) -> Topology:
    spec = importlib.util.spec_from_file_location(f"_topology_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValidationError(str(path), "cannot import", "check the file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    obj: Any
    if hasattr(mod, "topology"):
        obj = mod.topology()
    elif hasattr(mod, "TOPOLOGY"):
        obj = mod.TOPOLOGY
    else:
        raise ValidationError(str(path), "a Python topology defines topology() or TOPOLOGY",
                              "add def topology(): return Topology(...) or a spec dict")
    if isinstance(obj, Topology):
        return obj
    return from_dict(obj, source=str(path))


def dump(topo: Topology, fmt: str = "yaml") -> str:
    """Serialise a topology back to its spec form (YAML or JSON)."""
    d = topo.to_dict()
    if fmt == "json":
        return json.dumps(d, indent=2)
    return yaml.safe_dump(d, sort_keys=False)
