"""Parsing of the units people write in specs: ``100Mbit``, ``1.5Gbps``, ``10ms``, ``0.5%``.

The convention (one for every spec field; README "Units"):

* **rates** are bits per second.  ``bit`` words are unambiguous: ``bit``,
  ``kbit``, ``Mbit``, ``Gbit``, ``Tbit`` (SI prefixes, powers of 1000, prefix
  case ignored).  Bytes per second need a capital ``B`` followed by ``ps``:
  ``Bps``, ``KBps``, ``MBps``, ``GBps``.
* ``kbps``/``Mbps``/``Gbps`` (and a bare ``k``/``m``/``g`` or ``kb``/``mb``)
  are read as **bits** per second, as networking papers write them; but tc
  reads ``mbps`` as *megabytes* per second, so these spellings are accepted
  with an :class:`AmbiguousUnit` warning that says how they were read.
* ``KB``/``MB``/``GB`` (capital B, no ``ps``) are sizes: as a rate they are an
  error, never silently megabits.
* **durations** are seconds: ``s``, ``ms``, ``us``, ``ns``, ``min``;
  **sizes** are bytes with SI (``KB``, ``MB``: 1000) or binary (``KiB``,
  ``MiB``: 1024) prefixes; **loss** is a percentage (``0.5%`` or ``0.5``).
* a bare number is taken in the base unit (bit/s, seconds, bytes, percent) so
  that JSON written by ``to_dict`` reads back unchanged; a string holding only
  a number (``"20"``) is the same number.
"""

from __future__ import annotations

import math
import re
import warnings

from .errors import ValidationError


class AmbiguousUnit(UserWarning):
    """A unit spelling that tools read differently (``mbps``: megabits here, megabytes in tc)."""


#: spellings read as bit/s that another convention reads otherwise (lower-cased)
_AMBIGUOUS_RATE = {"bps", "kbps", "mbps", "gbps", "tbps", "b", "k", "m", "g", "kb", "mb", "gb"}

_NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

_RATE_UNITS = {
    "": 1.0, "bit": 1.0, "bps": 1.0, "b": 1.0,
    "kbit": 1e3, "kbps": 1e3, "kb": 1e3, "k": 1e3,
    "mbit": 1e6, "mbps": 1e6, "mb": 1e6, "m": 1e6,
    "gbit": 1e9, "gbps": 1e9, "gb": 1e9, "g": 1e9,
    "tbit": 1e12, "tbps": 1e12,
}
_BYTE_RATE_UNITS = {"Bps": 8.0, "KBps": 8e3, "MBps": 8e6, "GBps": 8e9}

_TIME_UNITS = {
    "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0,
    "ms": 1e-3, "msec": 1e-3, "msecs": 1e-3,
    "us": 1e-6, "usec": 1e-6, "usecs": 1e-6,
    "ns": 1e-9, "min": 60.0,
}

_SIZE_UNITS = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "k": 1000, "kb": 1000, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
    "p": -1, "pkt": -1, "pkts": -1, "packets": -1,
}


def _split(field: str, value: object, what: str, example: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise ValidationError(field, f"expected a {what}, got {value!r}", f"write e.g. {example}")
    if isinstance(value, (int, float)):
        if not math.isfinite(float(value)):
            raise ValidationError(field, f"{what} must be finite, got {value!r}", f"write e.g. {example}")
        return float(value), ""
    if not isinstance(value, str):
        raise ValidationError(field, f"expected a {what}, got {type(value).__name__}", f"write e.g. {example}")
    m = re.fullmatch(_NUM + r"\s*([A-Za-z%]*)", value.strip())
    if not m:
        raise ValidationError(field, f"cannot parse {value!r} as a {what}", f"write e.g. {example}")
    return float(m.group(1)), m.group(2)


def parse_rate(value: object, field: str = "rate") -> float:
    """Rate in bit/s.  ``100Mbit``, ``1Gbps``, ``12.5MBps`` (bytes), or a number of bit/s."""
    num, unit = _split(field, value, "rate", "'100Mbit' or '1Gbit'")
    if unit in _BYTE_RATE_UNITS:
        return num * _BYTE_RATE_UNITS[unit]
    if unit in ("KB", "MB", "GB", "TB", "B"):
        raise ValidationError(field, f"{value!r} is a size (bytes), not a rate",
                              f"write {num:g}{unit[:-1]}bit for bits per second or {num:g}{unit}ps for bytes per second")
    factor = _RATE_UNITS.get(unit.lower())
    if factor is None:
        raise ValidationError(field, f"unknown rate unit {unit!r}", "use bit, kbit, Mbit, Gbit (or Bps for bytes/s)")
    if unit.lower() in _AMBIGUOUS_RATE:
        bits = format_rate(num * factor)
        warnings.warn(AmbiguousUnit(
            f"{field}: {value!r} read as {bits} (bits per second); tc would read "
            f"{unit!r} as bytes per second - write {bits!r} (bits) or '{num * factor / 8e6:g}MBps' (bytes) "
            "to say which"), stacklevel=2)
    return num * factor


def parse_time(value: object, field: str = "delay") -> float:
    """Duration in seconds.  ``10ms``, ``250us``, ``1.5s``, or a number of seconds."""
    num, unit = _split(field, value, "duration", "'10ms' or '0.5s'")
    factor = _TIME_UNITS.get(unit.lower())
    if factor is None:
        raise ValidationError(field, f"unknown time unit {unit!r}", "use s, ms, us or ns")
    return num * factor


def parse_percent(value: object, field: str = "loss") -> float:
    """Percentage as a number in [0, 100].  ``0.5%`` or ``0.5`` both mean half a percent."""
    num, unit = _split(field, value, "percentage", "'0.5%'")
    if unit not in ("", "%"):
        raise ValidationError(field, f"unknown unit {unit!r} for a percentage", "write e.g. '0.5%'")
    return num


def parse_size(value: object, field: str = "size") -> int:
    """Size in bytes.  ``100MB``, ``64KiB`` or a number of bytes."""
    num, unit = _split(field, value, "size", "'100MB' or '64KiB'")
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None or factor < 0:
        raise ValidationError(field, f"unknown size unit {unit!r}", "use B, KB, MB, GB, KiB, MiB, GiB")
    return int(round(num * factor))


def parse_packets(value: object, field: str = "limit") -> int:
    """A queue limit in packets: ``1000``, ``1000p`` or ``1000packets``."""
    num, unit = _split(field, value, "packet count", "1000")
    if unit.lower() not in ("", "p", "pkt", "pkts", "packets"):
        raise ValidationError(field, f"unknown unit {unit!r} for a queue limit", "give a number of packets, e.g. 1000")
    if num != int(num):
        raise ValidationError(field, f"packet count must be whole, got {num}", "give an integer")
    return int(num)


def format_rate(bps: float) -> str:
    """Shortest exact-ish human form: ``100Mbit``, ``1.12Gbit``."""
    for unit, factor in (("Gbit", 1e9), ("Mbit", 1e6), ("Kbit", 1e3)):
        if bps >= factor:
            return f"{bps / factor:.12g}{unit}"
    return f"{bps:.12g}bit"


def format_time(seconds: float) -> str:
    if seconds == 0:
        return "0ms"
    if seconds >= 1:
        return f"{seconds:.12g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.12g}ms"
    return f"{seconds * 1e6:.12g}us"
