"""Name -> implementation registries, composed from one config (torchtitan style).

A workload or scheme is registered under a name with two things: its
parameter dataclass (torch-free, so a spec validates without importing
torch) and a ``"module:attribute"`` target that is imported only when a
process actually builds it.  Adding a workload is one module plus one
``register`` line; the config, the job file and the CLI pick it up by name.

From outside the package (no fork), a name resolves in this order:

1. the built-ins registered here;
2. an installed entry point in the group ``geo_testbed.schemes`` /
   ``geo_testbed.workloads`` whose name is the one asked for, pointing at an
   :class:`Entry` (``[project.entry-points."geo_testbed.schemes"] localsgd =
   "mypkg.localsgd:SCHEME"``);
3. a dotted path ``"package.module:ATTR"`` written as the name in the spec,
   ``ATTR`` an :class:`Entry`.

Every process of a trial resolves the name again (the job file carries it), so
the package must be importable there too: installed into the testbed's venv,
or on ``PYTHONPATH`` (the trial's processes inherit the environment).  A worked
example is ``examples/plugins`` (README "Adding a scheme or workload").
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from testbed.training.schema import ValidationError, from_mapping

__all__ = ["Entry", "Registry", "ENTRY_POINT_GROUPS"]

#: entry-point group of each registry kind
ENTRY_POINT_GROUPS = {"scheme": "geo_testbed.schemes", "workload": "geo_testbed.workloads"}


@dataclass(frozen=True)
class Entry:
    """What a registry holds, and what an external package exposes (``name`` is replaced by the
    name it is found under)."""

    name: str
    params: type  # a dataclass: its annotations are the parameters' schema
    target: str  # "package.module:attribute", imported lazily
    doc: str = ""


class Registry:
    """Entries by name; ``load`` imports the implementation on first use."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._resolved: dict[str, Entry] = {}  # external names found once per process

    def register(self, name: str, params: type, target: str, doc: str = "") -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._entries[name] = Entry(name, params, target, doc)

    @property
    def group(self) -> str:
        return ENTRY_POINT_GROUPS.get(self.kind, f"geo_testbed.{self.kind}s")

    def _entry_points(self) -> dict[str, metadata.EntryPoint]:
        return {ep.name: ep for ep in metadata.entry_points(group=self.group)}

    def names(self) -> list[str]:
        """Built-in names, then those of installed entry points (not imported)."""
        extra = sorted(n for n in self._entry_points() if n not in self._entries)
        return sorted(self._entries) + extra

    def builtin_names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str, field: str = "") -> Entry:
        where = field or self.kind
        if not isinstance(name, str):
            raise ValidationError(where, f"a {self.kind} name is text, got {name!r}", f"use one of {', '.join(self.names())}")
        if name in self._entries:
            return self._entries[name]
        if name in self._resolved:
            return self._resolved[name]
        if ":" in name:
            found = self._import(name, name, where)
        else:
            ep = self._entry_points().get(name)
            if ep is None:
                raise ValidationError(where, f"unknown {self.kind} {name!r}",
                                      f"use one of {', '.join(self.names())}, an installed {self.group} entry point, "
                                      "or 'package.module:ATTR'")
            found = self._import(ep.value, name, where, ep)
        self._resolved[name] = found
        return found

    def _import(self, target: str, name: str, field: str, ep: metadata.EntryPoint | None = None) -> Entry:
        what = f"entry point {name!r} ({self.group} = {target!r})" if ep else repr(target)
        module, _, attr = target.partition(":")
        try:
            obj = ep.load() if ep is not None else getattr(importlib.import_module(module), attr)
        except Exception as e:  # ImportError, AttributeError, or the plugin's own error at import
            raise ValidationError(field, f"cannot load {self.kind} {what}: {type(e).__name__}: {e}",
                                  "install its package into the testbed's venv (pip install -e DIR) or put it "
                                  "on PYTHONPATH; the name is 'package.module:ATTR'") from None
        if not isinstance(obj, Entry) or not dataclasses.is_dataclass(obj.params):
            raise ValidationError(field, f"{self.kind} {what} is {type(obj).__name__}, not a registry Entry",
                                  "expose ATTR = Entry(name, params=<dataclass>, target='module:callable', doc)")
        return dataclasses.replace(obj, name=name)

    def parse_params(self, name: str, params: Any, field: str) -> Any:
        """Validate ``params`` against the entry's dataclass (``field`` names the params mapping)."""
        return from_mapping(self.entry(name, field).params, params, field)

    def load(self, name: str) -> Any:
        module, _, attr = self.entry(name).target.partition(":")
        return getattr(importlib.import_module(module), attr)
