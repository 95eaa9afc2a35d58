"""The one spec language: pydantic field types with units, and pydantic errors as ours.

Every spec (topology, experiment, sweep, training and each scheme's and
workload's parameters) is a pydantic model built from these pieces:

* :data:`Rate`, :data:`Duration`, :data:`Size`, :data:`Percent`,
  :data:`Packets` accept the unit strings of :mod:`traffic_control.units`
  (one convention for every field) or a bare number in the base unit, and
  export a JSON Schema that says so (editors complete and check the YAML);
* :class:`SpecModel` forbids unknown keys and coerces nothing silently (a
  ``"2"`` is not an integer, ``true`` is not a number);
* :func:`validate` runs a model and turns the first pydantic error into our
  :class:`~traffic_control.errors.ValidationError`: the field path as the
  spec writes it (``links[0].forward.rate``), what is wrong, and the fix (a
  field's own ``fix`` hint, else one derived from the error), so the CLI
  prints one line and exits 2 - the same for every spec.

Why pydantic: one well-kept library gives types, unknown-key checks,
defaults, constraints and JSON Schema from one declaration, where the
hand-written validators it replaces had three styles and drifted apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter

from .errors import ValidationError
from .units import parse_packets, parse_percent, parse_rate, parse_size, parse_time

__all__ = ["Duration", "Field", "Packets", "Percent", "Rate", "Size", "SpecModel", "validate", "unit_field",
           "path_of", "to_validation_error"]

T = TypeVar("T")

_NUM = r"[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"


class SpecModel(BaseModel):
    """Base of every spec model: unknown keys are errors, no silent coercion, frozen values."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True,
                              use_attribute_docstrings=True)


def _unit(parse: Callable[[object, str], Any], what: str, pattern: str, examples: list[Any],
          description: str) -> Any:
    """An Annotated float/int that parses unit strings with ``parse`` and documents them."""

    def before(value: Any, info: pydantic.ValidationInfo) -> Any:
        return parse(value, info.field_name or what)

    class _Schema:
        @classmethod
        def __get_pydantic_json_schema__(cls, core: Any, handler: Any) -> dict[str, Any]:
            return {"anyOf": [{"type": "number"}, {"type": "string", "pattern": pattern}],
                    "description": description, "examples": examples}

    return [BeforeValidator(before), _Schema]


_RATE_RE = rf"^\s*{_NUM}\s*([kKmMgGtT]?(bit|bps|Bps|b)?|[kKmMgG])\s*$"
_TIME_RE = rf"^\s*{_NUM}\s*(s|sec|secs|ms|msec|msecs|us|usec|usecs|ns|min)?\s*$"
_SIZE_RE = rf"^\s*{_NUM}\s*([kKmMgG]i?[bB]?|[bB]|bytes?)?\s*$"
_PCT_RE = rf"^\s*{_NUM}\s*%?\s*$"
_PKT_RE = r"^\s*[0-9]+\s*(p|pkt|pkts|packets)?\s*$"

#: bits per second; ``100Mbit``, ``1Gbit``, ``12.5MBps`` (bytes), or a number of bit/s
Rate = Annotated[(float, *_unit(parse_rate, "rate", _RATE_RE, ["100Mbit", "1Gbit", "12.5MBps"],
                               "rate in bit/s: 100Mbit, 1Gbit, 512kbit; bytes/s as 12.5MBps; "
                               "Mbps/kbps are read as bits with a warning (tc reads them as bytes)"))]
#: seconds; ``10ms``, ``1.5s``, ``2min``, or a number of seconds
Duration = Annotated[(float, *_unit(parse_time, "duration", _TIME_RE, ["10ms", "1.5s", "2min"],
                                   "duration: 10ms, 250us, 1.5s, 2min, or a number of seconds"))]
#: bytes; ``64KiB``, ``100MB``, or a number of bytes
Size = Annotated[(int, *_unit(parse_size, "size", _SIZE_RE, ["64KiB", "2GiB", "100MB"],
                             "size in bytes: 64KiB, 2GiB (1024-based), 100MB (1000-based), or a number"))]
#: percent in [0, 100]; ``0.5%`` or ``0.5``
Percent = Annotated[(float, *_unit(parse_percent, "percentage", _PCT_RE, ["0.5%", 1],
                                  "percentage: 0.5% or 0.5 (half a percent)"), Field(ge=0, le=100))]
#: a packet count; ``1000`` or ``1000p``
Packets = Annotated[(int, *_unit(parse_packets, "packet count", _PKT_RE, [1000, "1000p"],
                                "queue limit in packets: 1000 or 1000p"), Field(ge=1))]


def unit_field(default: Any = None, *, fix: str = "", description: str = "", **kw: Any) -> Any:
    """``Field`` with a ``fix`` hint that error messages use (and the JSON Schema shows)."""
    extra = dict(kw.pop("json_schema_extra", None) or {})
    if fix:
        extra["fix"] = fix
    if "default_factory" not in kw:
        kw["default"] = default
    return Field(description=description or None, json_schema_extra=extra or None, **kw)


# -------------------------------------------------------------------------------- errors
def path_of(loc: tuple[Any, ...], prefix: str = "") -> str:
    """``('links', 0, 'forward', 'rate')`` -> ``links[0].forward.rate`` (under ``prefix``)."""
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
            out = f"{out}.{part}" if out else part
        else:  # a mapping key that is not an identifier (routes: 'a->b')
            out += f"[{part!r}]"
    return out


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_TYPE_WORDS = {
    "int_type": ("an integer", "write a whole number"), "int_from_float": ("an integer", "write a whole number"),
    "float_type": ("a number", "write a number"), "string_type": ("text", "write a string"),
    "bool_type": ("true or false", "write true or false"), "list_type": ("a list", "write a YAML list"),
    "dict_type": ("a mapping", "write a YAML mapping"), "model_type": ("a mapping", "write a YAML mapping"),
    "model_attributes_type": ("a mapping", "write a YAML mapping"),
    "dataclass_type": ("a mapping", "write a YAML mapping"), "tuple_type": ("a list", "write a YAML list"),
}


def _model_at(model: Any, loc: tuple[Any, ...]) -> Any:
    """The model class whose field ``loc`` names (for the list of allowed keys), or None."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = getattr(cur, "model_fields", None) or getattr(cur, "__pydantic_fields__", None)
        if not fields or part not in fields:
            return None
        cur = _inner_model(fields[part].annotation)
        if cur is None:
            return None
    return cur


def _inner_model(tp: Any) -> Any:
    """The model class inside ``X | None``, ``list[X]``, ``dict[str, X]``, ``Annotated[X, ...]``."""
    from typing import get_args, get_origin

    if isinstance(tp, type) and (issubclass(tp, BaseModel) or hasattr(tp, "__pydantic_fields__")):
        return tp
    for arg in get_args(tp) if get_origin(tp) is not None else ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _field_fix(model: Any, name: Any) -> str:
    fields = getattr(model, "model_fields", None) or getattr(model, "__pydantic_fields__", None) or {}
    f = fields.get(name) if isinstance(name, str) else None
    extra = getattr(f, "json_schema_extra", None) if f is not None else None
    return str(extra.get("fix", "")) if isinstance(extra, dict) else ""


_TAG_RE = re.compile(r"^(str|int|float|bool|none|list|dict|tuple|set|any)$|^[a-z-]+\[.*\]$|^[A-Z]")


def _clean(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """``loc`` without pydantic's union-member tags (``'str'``, ``'list[str]'``, ``'SchemeEntrySpec'``):
    the path as the spec writes it.  Our keys are lower-case names, never such tags."""
    return tuple(p for p in loc if not (isinstance(p, str) and _TAG_RE.match(p)))


def _best(errors: list[Any]) -> tuple[Any, list[Any]]:
    """The most specific error (deepest path once tags are gone; the first among equals), and the
    others at that same path (alternatives of a union that all failed there)."""
    cleaned = [(_clean(tuple(e.get("loc", ()))), e) for e in errors]
    depth = max(len(c) for c, _ in cleaned)
    at = [(c, e) for c, e in cleaned if len(c) == depth]
    loc = at[0][0]
    return dict(at[0][1], loc=loc), [e for c, e in at if c == loc]


def to_validation_error(exc: pydantic.ValidationError, root: Any = None, prefix: str = "") -> ValidationError:
    """The most specific of pydantic's errors as our one-line error: field path, problem, fix."""
    err, same = _best(exc.errors(include_url=False))
    loc = tuple(err.get("loc", ()))
    field = path_of(loc, prefix) or prefix or "spec"
    kind, value, ctx = err.get("type", ""), err.get("input"), err.get("ctx") or {}
    owner = _model_at(root, loc) if root is not None and loc else None
    hint = _field_fix(owner, loc[-1]) if owner is not None and loc else ""
    inner = ctx.get("error")
    if isinstance(inner, ValidationError):  # a unit or a check of ours: its words, the spec's path
        sub = inner.field
        if sub and (not loc or sub != loc[-1]):  # a model's own check names a key below it
            field = f"{field}{sub}" if sub.startswith("[") else (f"{field}.{sub}" if loc or prefix else sub)
        return ValidationError(field, inner.problem, inner.fix or hint)
    if kind == "extra_forbidden":
        fields = getattr(owner, "model_fields", None) or getattr(owner, "__pydantic_fields__", None) or {}
        names = [getattr(f, "alias", None) or n for n, f in fields.items()]
        return ValidationError(field, "unknown key", f"use one of: {', '.join(names)}" if names
                               else "it takes no keys here; remove it")
    if kind == "missing":
        return ValidationError(field, "missing", hint or f"add {loc[-1]}:" if loc else "add it")
    if kind in _TYPE_WORDS:
        whats = list(dict.fromkeys(_TYPE_WORDS[e["type"]][0] for e in same if e.get("type") in _TYPE_WORDS))
        what, fix = " or ".join(whats), _TYPE_WORDS[kind][1]
        return ValidationError(field, f"expected {what}, got {_describe(value)}", hint or fix)
    if kind == "literal_error":
        choices = ctx.get("expected", "")
        return ValidationError(field, f"{_describe(value)} is not one of {choices}", hint or f"use one of {choices}")
    for key, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if key in ctx and kind.endswith(("than", "than_equal")):
            return ValidationError(field, f"must be {word} {ctx[key]}, got {_describe(value)}",
                                   hint or f"use a value {word} {ctx[key]}")
    if kind in ("too_short", "too_long"):
        return ValidationError(field, err.get("msg", kind).lower(), hint or "check the number of entries")
    if kind == "string_pattern_mismatch":
        return ValidationError(field, f"{_describe(value)} has the wrong form", hint or f"match {ctx.get('pattern')}")
    msg = str(err.get("msg", kind))
    msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return ValidationError(field, msg, hint)


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def validate(tp: type[T] | Any, data: Any, prefix: str = "") -> T:
    """``data`` validated as ``tp`` (a model, a pydantic dataclass, or any annotation), errors as ours."""
    adapter = _ADAPTERS.get(tp)
    if adapter is None:
        adapter = _ADAPTERS[tp] = TypeAdapter(tp)
    try:
        return adapter.validate_python(data)
    except pydantic.ValidationError as e:
        raise to_validation_error(e, tp, prefix) from None
