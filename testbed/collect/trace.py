"""Merge a trial's spans and samples into one Chrome Trace Event file.

Output (``trace.json``, or ``trace.json.gz`` above a size threshold) opens in
Perfetto (ui.perfetto.dev) and chrome://tracing:

* one *process* track per host (``pid``), named ``<host> (<dc>)``; link
  counters live on a process track per sampled node (the routers);
* *thread* tracks per (role, rank, phase class) -- compute, intra-DC sync,
  WAN sync, wait, PS client (push/pull), PS (server), comm thread -- so that
  work that overlaps in time (a PGCS comm thread syncing while the worker
  computes) is never drawn on one track.  Should spans of one class still
  overlap (nested or concurrent spans), they spill onto extra lanes
  ``<class> #2``... rather than break the "no overlap on a track" rule;
* complete events (``"ph": "X"``) carrying the span's extra keys as args;
* counter events (``"ph": "C"``), named so Perfetto's "<name> <arg>" track
  names read well: ``<link> rate`` (``tx_Mbps``/``rx_Mbps`` from byte
  deltas), ``<link> queue`` (``backlog_bytes``), ``<link> qdisc``
  (cumulative ``drops``); ``<role> <rank> cpu`` (``percent``) and
  ``<role> <rank> memory`` (``rss_MiB``) per process;
* metadata (``"ph": "M"``) naming and ordering processes and threads.

Timestamps are microseconds since the trial's t0 (Chrome's unit).  Events
are written sorted by time with metadata first.  Standard library only, so
the runner can merge right after a trial.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from testbed.collect.records import read_trial

GZIP_THRESHOLD_BYTES = 20 * 1024 * 1024

# phase class -> (display name, sort order within a process)
CLASS_ORDER = {
    "compute": 0, "intra_sync": 1, "wan_sync": 2, "wait": 3, "ps_client": 4,
    "comm": 5, "server": 6, "other": 7,
}
CLASS_NAME = {
    "compute": "compute", "intra_sync": "intra-DC sync", "wan_sync": "WAN sync",
    "wait": "wait", "ps_client": "PS client", "comm": "comm thread", "server": "PS",
    "other": "other",
}
_PHASE_CLASS = {
    "compute": "compute", "eval": "compute", "intra_sync": "intra_sync",
    "wan_sync": "wan_sync", "wait": "wait", "push": "ps_client", "pull": "ps_client",
}
_SPAN_CORE = ("ts", "dur", "host", "dc", "rank", "role", "phase", "step")


def phase_class(role: str, phase: str) -> str:
    """Which thread-track class a span belongs to (role decides first, then phase)."""
    if role == "server":
        return "server"
    if role == "comm":
        return "comm"
    return _PHASE_CLASS.get(phase, "other")


def _us(ns: float) -> float:
    return round(ns / 1000.0, 3)


def _assign_lanes(spans: list[dict[str, Any]]) -> list[int]:
    """Greedy interval partitioning: lane index per span so no lane holds overlapping spans."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i]["ts"], -spans[i]["dur"]))
    lane_end: list[float] = []
    lanes = [0] * len(spans)
    for i in order:
        start, end = spans[i]["ts"], spans[i]["ts"] + spans[i]["dur"]
        for k, e in enumerate(lane_end):
            if e <= start:
                lanes[i] = k
                lane_end[k] = end
                break
        else:
            lanes[i] = len(lane_end)
            lane_end.append(end)
    return lanes


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    ev: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "ts": 0, "args": args}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _clean_args(rec: dict[str, Any]) -> dict[str, Any]:
    args = {k: v for k, v in rec.items() if k not in ("ts", "dur")}
    return {k: v for k, v in args.items() if isinstance(v, (str, int, float, bool)) or v is None}


def build_trace(spans: Iterable[dict[str, Any]], links: Iterable[dict[str, Any]] = (),
                procs: Iterable[dict[str, Any]] = (), metadata: dict[str, Any] | None = None,
                clock_offsets_ns: dict[str, int] | None = None,
                tcp: Iterable[dict[str, Any]] = (), cross: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """Chrome trace object from span and sample records (contract formats).

    ``clock_offsets_ns``: per-host offset subtracted from span ``ts`` when the
    hosts' clocks differ (several machines); empty on one machine.
    """
    offsets = clock_offsets_ns or {}
    spans = [dict(s, ts=s["ts"] - offsets.get(str(s.get("host")), 0)) for s in spans
             if s.get("dur", -1) >= 0]
    links = list(links)
    procs = list(procs)
    tcp = list(tcp)
    cross = list(cross)

    host_dc: dict[str, str] = {}
    for s in spans:
        host_dc.setdefault(str(s["host"]), str(s.get("dc", "")))
    for p in procs:
        host_dc.setdefault(str(p.get("host")), "")
    for r in tcp:
        host_dc.setdefault(str(r.get("node")), "")
    for r in cross:
        host_dc.setdefault(str(r.get("node")), "cross traffic")
    nodes = sorted({str(r.get("node")) for r in links} - set(host_dc))
    pids: dict[str, int] = {}
    for h in sorted(host_dc, key=lambda h: (host_dc[h], h)):
        pids[h] = len(pids) + 1
    for n in nodes:
        pids[n] = len(pids) + 1

    events: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    for h, pid in pids.items():
        label = f"{h} ({host_dc[h]})" if host_dc.get(h) else (f"{h} (links)" if h in nodes else h)
        meta.append(_meta("process_name", pid, None, {"name": label}))
        meta.append(_meta("process_sort_index", pid, None, {"sort_index": pid}))

    # ---- spans -> X events on (host, role, rank, class, lane) tracks
    groups: dict[tuple[str, str, Any, str], list[dict[str, Any]]] = defaultdict(list)
    for s in spans:
        cls = phase_class(str(s["role"]), str(s["phase"]))
        groups[(str(s["host"]), str(s["role"]), s.get("rank"), cls)].append(s)
    ranks_per_host: dict[str, set[Any]] = defaultdict(set)  # a comm thread shares its worker's rank
    for host, _role, rank, _ in groups:
        ranks_per_host[host].add(rank)
    tids: dict[tuple[str, str, Any, str, int], int] = {}
    next_tid: dict[str, int] = defaultdict(lambda: 1)
    track_keys = sorted(groups, key=lambda k: (k[0], str(k[2]), CLASS_ORDER[k[3]], k[1]))
    for key in track_keys:
        host, role, rank, cls = key
        recs = groups[key]
        lanes = _assign_lanes(recs)
        pid = pids[host]
        for lane in sorted(set(lanes)):
            tid = next_tid[host]
            next_tid[host] += 1
            tids[(host, role, rank, cls, lane)] = tid
            name = CLASS_NAME[cls]
            if len(ranks_per_host[host]) > 1:
                name = f"{role} {rank}: {name}"
            if lane:
                name += f" #{lane + 1}"
            meta.append(_meta("thread_name", pid, tid, {"name": name}))
            meta.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
        for rec, lane in zip(recs, lanes, strict=True):
            events.append({
                "name": str(rec["phase"]),
                "cat": cls,
                "ph": "X",
                "ts": _us(rec["ts"]),
                "dur": _us(rec["dur"]),
                "pid": pid,
                "tid": tids[(host, role, rank, cls, lane)],
                "args": _clean_args(rec),
            })

    events.extend(_link_counters(links, pids))
    events.extend(_proc_counters(procs, pids))
    events.extend(_tcp_counters(tcp, pids))
    events.extend(_cross_tracks(cross, pids))
    # metadata first, then by time; at equal time longer spans first (Chrome nesting rule)
    events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    other = {"source": "testbed", "time_unit": "us since trial t0"}
    if metadata:
        other.update({k: v for k, v in metadata.items() if isinstance(v, (str, int, float, bool))})
    return {"traceEvents": meta + events, "displayTimeUnit": "ms", "otherData": other}


def _link_counters(links: list[dict[str, Any]], pids: dict[str, int]) -> list[dict[str, Any]]:
    """Rate over [t_i, t_{i+1}] is placed at t_i: a counter holds until its next value."""
    by_if: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in links:
        by_if[(str(r.get("node")), str(r.get("ifname")))].append(r)
    out: list[dict[str, Any]] = []
    for (node, _ifname), recs in sorted(by_if.items()):
        recs.sort(key=lambda r: r["ts"])
        pid = pids[node]
        link = str(recs[0].get("link") or _ifname)
        for a, b in zip(recs, recs[1:], strict=False):
            dt = (b["ts"] - a["ts"]) / 1e9
            if dt <= 0:
                continue
            rates = {}
            for d in ("tx", "rx"):
                x0, x1 = a.get(f"{d}_bytes"), b.get(f"{d}_bytes")
                if isinstance(x0, (int, float)) and isinstance(x1, (int, float)):
                    rates[f"{d}_Mbps"] = round(max(x1 - x0, 0) * 8 / dt / 1e6, 4)
            if rates:
                out.append({"name": f"{link} rate", "ph": "C", "ts": _us(a["ts"]),
                            "pid": pid, "args": rates})
        for r in recs:
            if isinstance(r.get("qdisc_backlog_bytes"), (int, float)):
                out.append({"name": f"{link} queue", "ph": "C", "ts": _us(r["ts"]),
                            "pid": pid, "args": {"backlog_bytes": r["qdisc_backlog_bytes"]}})
            if isinstance(r.get("qdisc_drops"), (int, float)):
                out.append({"name": f"{link} qdisc", "ph": "C", "ts": _us(r["ts"]),
                            "pid": pid, "args": {"drops": r["qdisc_drops"]}})
    return out


def _proc_counters(procs: list[dict[str, Any]], pids: dict[str, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in sorted(procs, key=lambda r: r["ts"]):
        host = str(r.get("host"))
        who = f"{r.get('role')} {r.get('rank')}"
        if isinstance(r.get("cpu_percent"), (int, float)):
            out.append({"name": f"{who} cpu", "ph": "C", "ts": _us(r["ts"]), "pid": pids[host],
                        "args": {"percent": r["cpu_percent"]}})
        if isinstance(r.get("rss_bytes"), (int, float)):
            out.append({"name": f"{who} memory", "ph": "C", "ts": _us(r["ts"]), "pid": pids[host],
                        "args": {"rss_MiB": round(r["rss_bytes"] / 2**20, 2)}})
    return out


def _tcp_counters(tcp: list[dict[str, Any]], pids: dict[str, int]) -> list[dict[str, Any]]:
    """One counter track per connection on its host: congestion window (segments) and smoothed RTT (ms),
    and its retransmissions so far; a line is written only when the connection moved data."""
    out: list[dict[str, Any]] = []
    for r in sorted(tcp, key=lambda r: r["ts"]):
        node = str(r.get("node"))
        if node not in pids:
            continue
        conn = f"tcp {r.get('src')}->{r.get('dst')}"
        args = {}
        if isinstance(r.get("cwnd"), (int, float)):
            args["cwnd"] = r["cwnd"]
        if isinstance(r.get("rtt_us"), (int, float)):
            args["rtt_ms"] = round(r["rtt_us"] / 1e3, 3)
        if args:
            out.append({"name": conn, "ph": "C", "ts": _us(r["ts"]), "pid": pids[node], "args": args})
        if isinstance(r.get("retrans_total"), (int, float)):
            out.append({"name": f"{conn} retransmits", "ph": "C", "ts": _us(r["ts"]), "pid": pids[node],
                        "args": {"total": r["retrans_total"]}})
    return out


def _cross_tracks(cross: list[dict[str, Any]], pids: dict[str, int]) -> list[dict[str, Any]]:
    """Cross traffic: per flow a counter of its delivered rate (Mbit/s, between consecutive sink
    reports) on the receiving endpoint, and each short flow as a slice (its completion time) on the
    sending one, in lanes so that concurrent flows never overlap on one track."""
    out: list[dict[str, Any]] = []
    last: dict[str, tuple[int, int]] = {}
    for r in sorted(cross, key=lambda r: r["ts"]):
        node, flow = str(r.get("node")), str(r.get("flow"))
        if node not in pids:
            continue
        if r.get("kind") == "rx" and isinstance(r.get("bytes"), (int, float)):
            prev = last.get(flow)
            last[flow] = (r["ts"], r["bytes"])
            if prev is not None and r["ts"] > prev[0]:
                mbps = (r["bytes"] - prev[1]) * 8 / ((r["ts"] - prev[0]) / 1e9) / 1e6
                out.append({"name": f"cross {flow} delivered", "ph": "C", "ts": _us(r["ts"]), "pid": pids[node],
                            "args": {"Mbit_s": round(mbps, 3)}})
    shorts: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in cross:
        if (r.get("kind") == "short" and str(r.get("node")) in pids and _is_ns(r.get("start"))
                and isinstance(r.get("fct_s"), (int, float)) and r["fct_s"] >= 0):
            shorts[(str(r["node"]), str(r.get("flow")))].append(
                {"ts": r["start"], "dur": r["fct_s"] * 1e9, "bytes": r.get("bytes"), "n": r.get("n")})
    tid = 1000  # above the span tracks' tids of the same process (endpoints have no spans)
    for (node, flow), recs in sorted(shorts.items()):
        lanes = _assign_lanes(recs)
        base = tid
        for lane in sorted(set(lanes)):
            out.append(_meta("thread_name", pids[node], base + lane, {"name": f"cross {flow} short flows"
                                                                      + (f" #{lane + 1}" if lane else "")}))
        for rec, lane in zip(recs, lanes, strict=True):
            out.append({"name": f"{flow} short flow", "cat": "cross", "ph": "X", "ts": _us(rec["ts"]),
                        "dur": _us(rec["dur"]), "pid": pids[node], "tid": base + lane,
                        "args": {"bytes": rec["bytes"], "n": rec["n"]}})
        tid = base + max(lanes) + 1
    return out


def _is_ns(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def write_trace(obj: dict[str, Any], out_dir: Path,
                gzip_threshold: int = GZIP_THRESHOLD_BYTES) -> Path:
    """Write ``trace.json`` or, when larger than ``gzip_threshold``, ``trace.json.gz``.

    The other variant is removed so a directory never holds two traces.
    """
    out_dir = Path(out_dir)
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    plain, packed = out_dir / "trace.json", out_dir / "trace.json.gz"
    if len(data) > gzip_threshold:
        packed.write_bytes(gzip.compress(data, compresslevel=6))
        plain.unlink(missing_ok=True)
        return packed
    plain.write_bytes(data)
    packed.unlink(missing_ok=True)
    return plain


def load_trace(path: Path) -> dict[str, Any]:
    raw = Path(path).read_bytes()
    if str(path).endswith(".gz"):
        raw = gzip.decompress(raw)
    return json.loads(raw)


def merge_trial(trial_dir: Path, gzip_threshold: int = GZIP_THRESHOLD_BYTES
                ) -> tuple[Path | None, list[str]]:
    """Build and write a trial's trace; returns (path or None, problems found in its records)."""
    tr = read_trial(Path(trial_dir))
    if not tr.spans and not tr.links and not tr.procs and not tr.tcp and not tr.cross:
        return None, tr.problems + ["trace: nothing to merge (no spans, no samples)"]
    offsets = tr.manifest.get("clock_offsets_ns")
    obj = build_trace(tr.spans, tr.links, tr.procs,
                      metadata={"trial": tr.name, "scheme": tr.scheme},
                      clock_offsets_ns=offsets if isinstance(offsets, dict) else None, tcp=tr.tcp,
                      cross=tr.cross)
    problems = list(tr.problems)
    problems += [f"trace: {p}" for p in validate_trace(obj)]
    return write_trace(obj, Path(trial_dir), gzip_threshold), problems


# --------------------------------------------------------------------------- validation

_KNOWN_PH = set("BEXCMibensftPONDRrc(){}") | {"I"}
_NUM = (int, float)


def validate_trace(obj: Any, eps_us: float = 0.0015) -> list[str]:
    """Check Chrome Trace Event rules; returns a list of problems (empty = valid).

    Checks: top-level shape; required fields per phase type; durations >= 0;
    per-track (pid, tid) monotonic ``ts`` in file order for X/B/E events;
    no overlapping complete events on one track (strict: nesting is also
    reported, since our tracks are meant to hold sequential work); balanced
    B/E pairs; counter args numeric and per (pid, name) monotonic.
    ``eps_us`` absorbs the rounding of ns to 3 decimals of us.
    """
    errs: list[str] = []
    if isinstance(obj, list):
        events = obj
    elif isinstance(obj, dict) and isinstance(obj.get("traceEvents"), list):
        events = obj["traceEvents"]
    else:
        return ["top level must be a list of events or an object with a traceEvents list"]

    last_ts: dict[tuple[Any, Any], float] = {}
    last_end: dict[tuple[Any, Any], tuple[float, int]] = {}
    open_b: dict[tuple[Any, Any], list[str]] = defaultdict(list)
    counter_ts: dict[tuple[Any, str], float] = {}

    def bad(i: int, msg: str) -> None:
        if len(errs) < 200:
            errs.append(f"event {i}: {msg}")

    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            bad(i, "not an object")
            continue
        ph = ev.get("ph")
        if ph not in _KNOWN_PH:
            bad(i, f"unknown or missing ph {ph!r}")
            continue
        if ph != "E" and not isinstance(ev.get("name"), str):
            bad(i, "missing name")
        if ph == "M":
            if not isinstance(ev.get("pid"), int):
                bad(i, "metadata without integer pid")
            if ev.get("name") in ("process_name", "thread_name") and not isinstance(
                    (ev.get("args") or {}).get("name"), str):
                bad(i, f"{ev.get('name')} without args.name")
            if ev.get("name", "").startswith("thread_") and not isinstance(ev.get("tid"), int):
                bad(i, "thread metadata without integer tid")
            continue
        ts = ev.get("ts")
        if not isinstance(ts, _NUM) or isinstance(ts, bool):
            bad(i, "missing numeric ts")
            continue
        if not isinstance(ev.get("pid"), int):
            bad(i, "missing integer pid")
            continue
        if ph == "C":
            args = ev.get("args")
            if not isinstance(args, dict) or not args or not all(
                    isinstance(v, _NUM) and not isinstance(v, bool) for v in args.values()):
                bad(i, "counter args must be a non-empty dict of numbers")
            ckey = (ev["pid"], ev.get("name", ""))
            if ts + eps_us < counter_ts.get(ckey, float("-inf")):
                bad(i, f"counter {ckey[1]!r} goes back in time")
            counter_ts[ckey] = max(ts, counter_ts.get(ckey, ts))
            continue
        if ph not in ("X", "B", "E"):
            continue
        if not isinstance(ev.get("tid"), int):
            bad(i, "missing integer tid")
            continue
        track = (ev["pid"], ev["tid"])
        if ts + eps_us < last_ts.get(track, float("-inf")):
            bad(i, f"track pid={track[0]} tid={track[1]}: ts {ts} before previous {last_ts[track]}")
        last_ts[track] = max(ts, last_ts.get(track, ts))
        if ph == "X":
            dur = ev.get("dur")
            if not isinstance(dur, _NUM) or dur < 0:
                bad(i, "X event needs dur >= 0")
                continue
            prev = last_end.get(track)
            if prev is not None and ts + eps_us < prev[0]:
                bad(i, f"track pid={track[0]} tid={track[1]}: overlaps event {prev[1]} "
                       f"(starts {ts} before it ends {prev[0]})")
            if prev is None or ts + dur > prev[0]:
                last_end[track] = (ts + dur, i)
        elif ph == "B":
            open_b[track].append(ev["name"])
        else:
            if not open_b[track]:
                bad(i, f"track pid={track[0]} tid={track[1]}: E without B")
            else:
                open_b[track].pop()
    for track, stack in open_b.items():
        if stack:
            errs.append(f"track pid={track[0]} tid={track[1]}: {len(stack)} B without E")
    return errs
