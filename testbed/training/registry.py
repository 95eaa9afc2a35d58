"""Name -> implementation registries, composed from one config (torchtitan style).

A workload or scheme is registered under a name with two things: its
parameter dataclass (torch-free, so a spec validates without importing
torch) and a ``"module:attribute"`` target that is imported only when a
process actually builds it.  Adding a workload is one module plus one
``register`` line; the config, the job file and the CLI pick it up by name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from testbed.training.schema import ValidationError, from_mapping

__all__ = ["Entry", "Registry"]


@dataclass(frozen=True)
class Entry:
    name: str
    params: type
    target: str  # "package.module:attribute", imported lazily
    doc: str = ""


class Registry:
    """Entries by name; ``load`` imports the implementation on first use."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, params: type, target: str, doc: str = "") -> None:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._entries[name] = Entry(name, params, target, doc)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, name: str, field: str = "") -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise ValidationError(
                field or self.kind, f"unknown {self.kind} {name!r}", f"use one of {', '.join(self.names())}"
            ) from None

    def parse_params(self, name: str, params: Any, field: str) -> Any:
        """Validate ``params`` against the entry's dataclass (``field`` names the params mapping)."""
        return from_mapping(self.entry(name, field).params, params, field)

    def load(self, name: str) -> Any:
        module, _, attr = self.entry(name).target.partition(":")
        return getattr(importlib.import_module(module), attr)
