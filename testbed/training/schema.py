"""Typed config sections: plain mapping -> dataclass, with errors that name the field.

Every section of the training config (and every workload's and scheme's
parameters) is a dataclass whose annotations *are* the schema: this module
checks unknown keys, types (``int``, ``float``, ``str``, ``bool``,
``Literal``, ``X | None``, ``list[...]``, ``dict[str, ...]``, nested
dataclasses) and then calls the dataclass's optional ``check(field)`` hook
for value constraints.  Errors are ``ValidationError(field_path, problem,
fix)`` so the CLI can point at ``training.scheme.staleness``.  Standard
library only, so validating a spec never imports torch.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from traffic_control.errors import ValidationError

T = TypeVar("T")

__all__ = ["from_mapping", "to_plain", "ValidationError"]


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_describe(a) for a in get_args(tp))
    if origin is list:
        return f"list of {_describe(get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {_describe(get_args(tp)[1])}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, field: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ValidationError(field, f"{value!r} is not one of {_describe(tp)}", f"use one of {_describe(tp)}")
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise ValidationError(field, "must not be null", f"give a {_describe(tp)}")
        errors: list[tuple[Any, ValidationError]] = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, field)
            except ValidationError as exc:
                errors.append((arg, exc))
        if len(errors) == 1:
            raise errors[0][1]
        for arg, exc in errors:  # the arm of the value's own shape has the useful message
            shaped = (isinstance(value, Mapping) and (dataclasses.is_dataclass(arg) or get_origin(arg) is dict)) or (
                isinstance(value, (list, tuple)) and get_origin(arg) is list)
            if shaped:
                raise exc
        raise ValidationError(field, f"{value!r} is not a {_describe(tp)}", f"give a {_describe(tp)}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ValidationError(field, f"expected a list, got {type(value).__name__}", "write a YAML list")
        (item,) = get_args(tp)
        return [_convert(v, item, f"{field}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ValidationError(field, f"expected a mapping, got {type(value).__name__}", "write a YAML mapping")
        _, vt = get_args(tp)
        return {str(k): _convert(v, vt, f"{field}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, field)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ValidationError(field, f"expected true/false, got {value!r}", "write true or false")
    unit = _unit_parser(field, tp)
    if unit is not None and isinstance(value, str):  # `wall_s: 2min`, `grad_bytes: 4KiB` (traffic_control.units)
        parsed = unit(value, field)
        return int(parsed) if tp is int else float(parsed)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValidationError(field, f"expected an integer, got {value!r}", "write a whole number")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValidationError(field, f"expected a number, got {value!r}", "write a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValidationError(field, f"expected a string, got {value!r}", "write a string")
    raise TypeError(f"schema: unsupported annotation {tp!r} at {field}")  # programming error


def _unit_parser(field: str, tp: Any) -> Any:
    """Numeric fields named ``*_s`` (seconds), ``*_bytes`` and ``*_bps`` also take the unit
    strings every other spec field takes, so one convention holds everywhere."""
    if tp not in (int, float):
        return None
    from traffic_control.units import parse_rate, parse_size, parse_time

    name = field.rsplit(".", 1)[-1]
    if name.endswith("_s"):
        return parse_time
    if name.endswith("_bytes"):
        return parse_size
    if name.endswith("_bps"):
        return parse_rate
    return None


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
        raise ValidationError(field, f"expected a mapping, got {type(data).__name__}", "write a YAML mapping")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise ValidationError(
            _join(field, unknown[0]), "unknown key", f"known keys: {', '.join(sorted(fields))}"
        )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        sub = _join(field, name)
        if name in data:
            kwargs[name] = _convert(data[name], hints[name], sub)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValidationError(sub, "missing", f"give {name} ({_describe(hints[name])})")
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if callable(check):
        check(field)
    return obj


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

