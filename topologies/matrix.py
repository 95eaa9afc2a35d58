"""A topology from a published latency/bandwidth matrix: a CSV of region pairs, with its sources recorded.

Format (header required; ``#`` lines are comments)::

    a,b,rtt,rate,source
    us-east-1,us-east-2,11ms,1.12Gbit,https://example.org/inter-region-2024 (table 3)
    us-east-1,eu-west-2,76ms,1.16Gbit,same
    ...

Every row is one WAN link (both directions the same; ``rtt`` is the round trip, each direction gets
half); ``rate`` may be empty (unshaped); ``source`` says where the row's numbers come from and is
required, since a figure built on a matrix must be able to name it.  Regions become DCs: a DC name is
derived from the region (lower-case letters and digits, at most 8 bytes, digits kept at the end:
``ap-northeast-1`` -> ``apnorth1``) and the region itself is the DC's ``label``.  Pairs absent from
the matrix are relayed (the routes follow the least delay), so a partial matrix is a partial mesh.

The result is an ordinary spec mapping: ``from_dict`` validates it, and its ``description`` records the
file and every distinct source, so each manifest of a trial on it carries them.
"""

from __future__ import annotations

import csv
import re
from typing import Any

from traffic_control.errors import ValidationError

from .model import MAX_DC_NAME

COLUMNS = ("a", "b", "rtt", "rate", "source")


def data_lines(text: str) -> list[tuple[int, str]]:
    """(line number in the file, text) of the header and data rows: blank and ``#`` lines skipped."""
    return [(n, ln) for n, ln in enumerate(text.splitlines(), start=1)
            if ln.strip() and not ln.lstrip().startswith("#")]


def dc_name(region: str, taken: set[str]) -> str:
    """A DC name for ``region``: ``[a-z][a-z0-9]*``, at most MAX_DC_NAME bytes, unique among ``taken``."""
    flat = re.sub(r"[^a-z0-9]", "", region.lower())
    flat = re.sub(r"^[0-9]+", "", flat) or "dc"
    digits = re.search(r"[0-9]*$", flat).group(0)[-3:]  # type: ignore[union-attr]
    head = flat[: len(flat) - len(digits)] if digits else flat
    name = (head[: MAX_DC_NAME - len(digits)] + digits)[:MAX_DC_NAME]
    k = 2
    base = name
    while name in taken:
        suffix = str(k)
        name = base[: MAX_DC_NAME - len(suffix)] + suffix
        k += 1
    return name


def from_matrix_csv(text: str, *, name: str, source_file: str = "matrix", hosts: int = 1,
                    scale: float = 1.0, lan: dict[str, Any] | None = None) -> dict[str, Any]:
    """The topology spec mapping of a matrix (see the module docstring); errors name ``FILE[line N].COLUMN``."""
    numbered = data_lines(text)
    lines = [ln for _, ln in numbered]
    reader = csv.DictReader(lines)
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValidationError(f"{source_file}.header", f"missing column(s) {', '.join(missing)} (found "
                              f"{', '.join(header) or 'none'})", f"the header is {','.join(COLUMNS)}")
    extra = [c for c in header if c not in COLUMNS]
    if extra:
        raise ValidationError(f"{source_file}.header", f"unknown column(s) {', '.join(extra)}",
                              f"use {','.join(COLUMNS)}")
    names: dict[str, str] = {}
    links: list[dict[str, Any]] = []
    sources: list[str] = []
    seen: set[frozenset[str]] = set()
    for i, raw in enumerate(reader):
        where = f"{source_file}[line {numbered[i + 1][0]}]"
        row = {str(k).strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        for col in ("a", "b", "rtt", "source"):
            if not row.get(col):
                raise ValidationError(f"{where}.{col}", "empty", "every row names a, b, rtt and the source of its "
                                      "numbers (a URL or a citation)")
        a, b = row["a"], row["b"]
        if a == b:
            raise ValidationError(f"{where}.b", f"a link from {a!r} to itself", "name two different regions")
        pair = frozenset((a, b))
        if pair in seen:
            raise ValidationError(where, f"{a} - {b} given twice", "one row per region pair")
        seen.add(pair)
        for region in (a, b):
            if region not in names:
                names[region] = dc_name(region, set(names.values()))
        link: dict[str, Any] = {"a": names[a], "b": names[b], "rtt": row["rtt"]}
        if row.get("rate"):
            link["rate"] = row["rate"]
        links.append(link)
        if row["source"] not in sources:
            sources.append(row["source"])
    if not links:
        raise ValidationError(source_file, "no rows", "give one row per region pair")
    dcs = [{"name": n, "label": region} for region, n in names.items()]
    spec: dict[str, Any] = {
        "name": name,
        "description": f"Imported from {source_file} ({len(links)} region pairs); sources: " + "; ".join(sources),
        "defaults": {"hosts": hosts, **({"lan": lan} if lan else {})},
        "dcs": dcs,
        "links": links,
    }
    if scale != 1.0:
        spec["scale"] = scale
    return spec


def load_matrix(path: str, *, name: str | None = None, hosts: int = 1, scale: float = 1.0) -> tuple[Any, dict]:
    """``(Topology, spec mapping)`` of the matrix file at ``path``; a spec error names the CSV row and column."""
    from pathlib import Path

    from .model import from_dict

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ValidationError(str(path), f"cannot read: {e.strerror}", "check the path") from None
    spec = from_matrix_csv(text, name=name or re.sub(r"[^A-Za-z0-9_.-]", "_", p.stem), source_file=p.name,
                           hosts=hosts, scale=scale)
    rows = [n for n, _ in data_lines(text)][1:]
    try:
        return from_dict(spec, source=str(p)), spec
    except ValidationError as e:
        m = re.match(r"links\[(\d+)\](.*)", e.field or "")
        if m and int(m.group(1)) < len(rows):
            col = m.group(2).lstrip(".") or "row"
            raise ValidationError(f"{p.name}[line {rows[int(m.group(1))]}].{col}", e.problem, e.fix) from None
        raise
