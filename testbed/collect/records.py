"""Tolerant readers for the stored records of a trial (see docs/CONTRACTS.md).

A crashed trial leaves half-written JSON lines, empty files and missing
files behind.  Every reader here returns what it could read plus a list of
human-readable problems instead of raising, so the trace merge, the tables
and ``testbed report`` can all produce what is there and say what is not.
Standard library only: the runner uses this without pandas.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRIAL_NAME = re.compile(r"^(?P<scheme>.+)-r(?P<rep>\d+)$")

METRICS_COLUMNS = ("step", "wall_s", "loss", "acc", "expert", "updates")
SPAN_REQUIRED = ("ts", "dur", "host", "role", "phase")


def parse_trial_name(name: str) -> tuple[str, int | None]:
    """Split ``<scheme>-r<rep>`` into scheme and repetition (rep None if absent)."""
    m = TRIAL_NAME.match(name)
    if not m:
        return name, None
    return m.group("scheme"), int(m.group("rep"))


def _rel(path: Path, base: Path | None) -> str:
    if base is None:
        return str(path)
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def read_jsonl(path: Path, base: Path | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Read one JSON object per line; skip and report lines that do not parse.

    A bad *last* line is the normal trace of a process killed mid-write and
    is reported as truncated; bad lines elsewhere are reported by number.
    """
    problems: list[str] = []
    name = _rel(path, base)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return [], [f"{name}: missing"]
    except OSError as exc:
        return [], [f"{name}: unreadable ({exc.strerror or exc})"]
    text = raw.decode("utf-8", errors="replace")
    lines = text.split("\n")
    # a trailing newline leaves one empty string at the end; that is fine
    last_idx = len(lines) - 1
    while last_idx >= 0 and not lines[last_idx].strip():
        last_idx -= 1
    out: list[dict[str, Any]] = []
    bad: list[int] = []
    for i, line in enumerate(lines[: last_idx + 1]):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            if i == last_idx:
                problems.append(f"{name}: last line truncated (ignored)")
            else:
                bad.append(i + 1)
            continue
        if isinstance(obj, dict):
            out.append(obj)
        else:
            bad.append(i + 1)
    if bad:
        shown = ", ".join(str(b) for b in bad[:5]) + (" ..." if len(bad) > 5 else "")
        problems.append(f"{name}: {len(bad)} unparsable line(s) ignored (line {shown})")
    if not out and not problems:
        problems.append(f"{name}: empty")
    return out, problems


def _num(value: str) -> float | int | None:
    value = value.strip()
    if value == "":
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return None


def read_metrics_csv(path: Path, base: Path | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Read ``metrics.csv``; empty cells become None, a torn last row is dropped."""
    name = _rel(path, base)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return [], [f"{name}: missing"]
    except OSError as exc:
        return [], [f"{name}: unreadable ({exc.strerror or exc})"]
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        return [], [f"{name}: empty"]
    header = [h.strip() for h in rows[0]]
    problems: list[str] = []
    missing_cols = [c for c in ("step", "wall_s", "loss") if c not in header]
    if missing_cols:
        problems.append(f"{name}: header lacks {', '.join(missing_cols)}")
    out: list[dict[str, Any]] = []
    torn = 0
    for row in rows[1:]:
        if not row:
            continue
        if len(row) != len(header):
            torn += 1
            continue
        rec = {h: _num(v) for h, v in zip(header, row, strict=True)}
        if rec.get("step") is None or rec.get("wall_s") is None:
            torn += 1
            continue
        out.append(rec)
    if torn:
        problems.append(f"{name}: {torn} incomplete row(s) ignored")
    if not out:
        problems.append(f"{name}: no complete rows")
    return out, problems


def read_json(path: Path, base: Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """Read a JSON object file (manifest, plan); {} plus a problem if absent or torn."""
    name = _rel(path, base)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, [f"{name}: missing"]
    except (OSError, ValueError) as exc:
        return {}, [f"{name}: unreadable ({exc})"]
    if not isinstance(obj, dict):
        return {}, [f"{name}: not a JSON object"]
    return obj, []


@dataclass
class TrialRecords:
    """Everything one trial directory holds, as plain Python objects."""

    path: Path
    name: str
    scheme: str
    rep: int | None
    spans: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    procs: list[dict[str, Any]] = field(default_factory=list)
    tcp: list[dict[str, Any]] = field(default_factory=list)
    cross: list[dict[str, Any]] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _valid_span(rec: dict[str, Any]) -> bool:
    """Required keys with usable types: numeric ts, dur >= 0; string host, role, phase."""
    if any(k not in rec for k in SPAN_REQUIRED):
        return False
    if not (_is_num(rec["ts"]) and _is_num(rec["dur"]) and rec["dur"] >= 0):
        return False
    return all(isinstance(rec[k], str) for k in ("host", "role", "phase"))


def _fix_ints(rec: dict[str, Any]) -> bool:
    """Null a non-integer ``rank``/``step`` in place; True if something was changed."""
    changed = False
    for k in ("rank", "step"):
        v = rec.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v != int(v):
            rec[k] = None
            changed = True
    return changed


def partial_servers(manifest: dict[str, Any]) -> list[str]:
    """A trial across servers whose records from some server are only what was streamed while it ran (the
    server could not be reached at its end, ``testbed.cluster.stream``): one line per such server."""
    records = (manifest.get("cluster") or {}).get("records") or {}
    return [f"records of server {s}: partial, streamed until {r.get('streamed_until_s')} s after t0 (the server "
            "could not be reached at the trial's end)" for s, r in sorted(records.items())
            if isinstance(r, dict) and r.get("fetched") is False]


def read_trial(trial_dir: Path) -> TrialRecords:
    """Read spans, metrics, samples and manifest of one trial, tolerating damage."""
    trial_dir = Path(trial_dir)
    manifest, mprobs = read_json(trial_dir / "manifest.json", trial_dir)
    scheme, rep = parse_trial_name(trial_dir.name)
    if isinstance(manifest.get("scheme"), str):
        scheme = manifest["scheme"]
    tr = TrialRecords(path=trial_dir, name=trial_dir.name, scheme=scheme, rep=rep, manifest=manifest)
    tr.problems.extend(mprobs)
    tr.problems.extend(partial_servers(manifest))
    ev_dir = trial_dir / "events"
    files = sorted(ev_dir.glob("*.jsonl")) if ev_dir.is_dir() else []
    if not files:
        tr.problems.append("events/*.jsonl: missing (no spans)")
    for f in files:
        recs, probs = read_jsonl(f, trial_dir)
        tr.problems.extend(probs)
        good = [r for r in recs if _valid_span(r)]
        if len(good) != len(recs):
            tr.problems.append(
                f"{_rel(f, trial_dir)}: {len(recs) - len(good)} span(s) without usable "
                "ts/dur/host/role/phase ignored"
            )
        fixed = sum(_fix_ints(r) for r in good)
        if fixed:
            tr.problems.append(f"{_rel(f, trial_dir)}: {fixed} span(s) with a non-integer "
                               "rank/step (set to null)")
        tr.spans.extend(good)
    tr.metrics, probs = read_metrics_csv(trial_dir / "metrics.csv", trial_dir)
    tr.problems.extend(probs)
    for attr, rel in (("links", "samples/links.jsonl"), ("procs", "samples/procs.jsonl"),
                      ("tcp", "samples/tcp.jsonl"), ("cross", "samples/cross.jsonl")):
        if attr in ("tcp", "cross") and not (trial_dir / rel).exists():  # optional: older trials, no cross traffic
            continue
        recs, probs = read_jsonl(trial_dir / rel, trial_dir)
        recs = [r for r in recs if _is_num(r.get("ts"))]
        setattr(tr, attr, recs)
        tr.problems.extend(probs)
    return tr


def is_trial_dir(path: Path) -> bool:
    """A trial directory holds records (events/, samples/, metrics.csv) or sits under trials/."""
    path = Path(path)
    if not path.is_dir():
        return False
    if (path / "events").is_dir() or (path / "samples").is_dir() or (path / "metrics.csv").exists():
        return True
    return path.parent.name == "trials"


def is_run_dir(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / "trials").is_dir()


def trial_dirs(run_dir: Path) -> list[Path]:
    """Trial directories of a run, sorted by scheme then repetition."""
    tdir = Path(run_dir) / "trials"
    if not tdir.is_dir():
        return []
    dirs = [d for d in tdir.iterdir() if d.is_dir()]

    def key(d: Path) -> tuple[str, int, str]:
        scheme, rep = parse_trial_name(d.name)
        return scheme, rep if rep is not None else -1, d.name

    return sorted(dirs, key=key)


def run_dirs(experiment_dir: Path) -> list[Path]:
    """Run directories directly under an experiment directory."""
    exp = Path(experiment_dir)
    if not exp.is_dir():
        return []
    return sorted(d for d in exp.iterdir() if is_run_dir(d))


def classify_dir(path: Path) -> str:
    """'trial', 'run', 'experiment' or 'unknown' for a results directory."""
    path = Path(path)
    if is_run_dir(path):
        return "run"
    if is_trial_dir(path):
        return "trial"
    if run_dirs(path):
        return "experiment"
    return "unknown"


def start_barrier_s(trial_dir: Path) -> float | None:
    """When the trial's start barrier released (seconds since t0), from the first process's record of it.

    The zero of ``metrics.csv``'s ``wall_s`` (see ``testbed.training.start``);
    None for records made before the barrier existed, or if no process got there.
    """
    for path in sorted((Path(trial_dir) / "events").glob("*.jsonl")):
        rows, _ = read_jsonl(path)
        for r in rows:
            if r.get("phase") == "wait" and r.get("what") == "start_barrier" and isinstance(r.get("start_ns"), int):
                return r["start_ns"] / 1e9
    return None

