"""Typed config sections: plain mapping -> dataclass, validated by pydantic.

Every section of the training config (and every workload's and scheme's
parameters) is a stdlib dataclass whose annotations *are* the schema (unit
fields use :mod:`traffic_control.fields`' ``Duration``, ``Size``...).  Each
dataclass gets a strict pydantic *mirror* model (same fields, types and
defaults; unknown keys forbidden, nothing coerced), generated once: pydantic
checks types, unknown keys, units and defaults, and exports the JSON Schema
(``testbed schema``); the validated values become the dataclass, and its
optional ``check(field)`` hook adds value constraints that need several
fields.  Errors are ``ValidationError(field_path, problem, fix)`` so the CLI
points at ``training.scheme.staleness``.  Why mirrors and not pydantic
dataclasses: pydantic's strict mode accepts only dataclass *instances* for a
dataclass field, never the mapping a YAML file holds.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from traffic_control.errors import ValidationError
from traffic_control.fields import validate

T = TypeVar("T")

__all__ = ["from_mapping", "mirror", "to_plain", "ValidationError"]


class _Mirror(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)


_MIRRORS: dict[type, type[BaseModel]] = {}
_ORIGINALS: dict[type[BaseModel], type] = {}


def _mirror_type(tp: Any) -> Any:
    """``tp`` with every dataclass inside replaced by its mirror model."""
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return mirror(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin is None or not args:
        return tp
    if origin is Annotated:
        return Annotated[(_mirror_type(args[0]), *tp.__metadata__)]
    if origin in (Union, types.UnionType):
        return Union[tuple(_mirror_type(a) for a in args)]  # noqa: UP007 - built from a tuple
    if origin in (list, tuple, dict, set, frozenset):
        return origin[tuple(_mirror_type(a) for a in args)] if len(args) > 1 else origin[_mirror_type(args[0])]
    return tp  # Literal, ClassVar...


def mirror(cls: type) -> type[BaseModel]:
    """The strict pydantic model of dataclass ``cls`` (cached; its JSON Schema is the section's)."""
    found = _MIRRORS.get(cls)
    if found is not None:
        return found
    hints = get_type_hints(cls, include_extras=True)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        doc = f.metadata.get("doc") if f.metadata else None
        if f.default is not dataclasses.MISSING:
            spec = Field(default=f.default, description=doc)
        elif f.default_factory is not dataclasses.MISSING:
            spec = Field(default_factory=f.default_factory, description=doc)
        else:
            spec = Field(description=doc)
        fields[f.name] = (_mirror_type(hints[f.name]), spec)
    model = create_model(cls.__name__, __base__=_Mirror, __doc__=cls.__doc__, **fields)
    _MIRRORS[cls], _ORIGINALS[model] = model, cls
    return model


def _back(value: Any) -> Any:
    """Validated mirror values -> dataclasses (recursively); everything else unchanged."""
    if isinstance(value, BaseModel) and type(value) in _ORIGINALS:
        cls = _ORIGINALS[type(value)]
        return cls(**{name: _back(getattr(value, name)) for name in type(value).model_fields})
    if isinstance(value, list):
        return [_back(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_back(v) for v in value)
    if isinstance(value, dict):
        return {k: _back(v) for k, v in value.items()}
    return value


def _check(obj: Any, field: str) -> None:
    """Run ``check(field)`` hooks bottom-up: nested sections first, as a reader expects."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _check(getattr(obj, f.name), _join(field, f.name))
        check = getattr(obj, "check", None)
        if callable(check):
            check(field)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check(v, f"{field}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _check(v, _join(field, str(k)))


def from_mapping(cls: type[T], data: Any, field: str = "") -> T:
    """Build dataclass ``cls`` from ``data`` (a mapping or None = all defaults).

    Unknown keys, wrong types and failed ``check`` hooks raise
    ``ValidationError`` whose field is ``field.key``.
    """
    if data is None:
        data = {}
    if dataclasses.is_dataclass(data) and isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ValidationError(field or cls.__name__, f"expected a mapping, got {type(data).__name__}",
                              "write a YAML mapping")
    obj = _back(validate(mirror(cls), dict(data), field))
    _check(obj, field)
    return obj  # type: ignore[no-any-return]


def to_plain(obj: Any) -> Any:
    """Dataclasses/tuples -> dicts/lists that JSON and YAML can hold."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
