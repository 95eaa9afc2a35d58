"""Cross traffic: background flows that share the emulated WAN with training (README "Cross traffic").

A spec's ``cross_traffic:`` section lists flows between DCs::

    cross_traffic:
      - {from: a, to: b, pattern: constant, rate: 20Mbit}             # paced TCP (greedy without rate)
      - {from: a, to: b, pattern: constant, rate: 10Mbit, protocol: udp}   # unresponsive CBR
      - {from: b, to: a, pattern: on_off, on_time: 2s, off_time: 3s}  # bursts at whatever TCP gets
      - {from: c, to: a, pattern: short_flows, size: 200KB, arrival_rate: 5}  # Poisson, 5 flows/s

Each DC that sends or receives cross traffic gets one extra endpoint on its
LAN (``<dc>-xt``, address .210, the DC's LAN shape and TCP settings, see
:mod:`.endpoints`), so the flows cross the same routers and WAN queues as
training traffic but never a trainer's NIC, cgroup or CPU accounting.  The
generator (:mod:`.cross_gen`) runs there: a sink per destination DC reports
each flow's delivered bytes every 0.5 s, a sender per source DC runs each
flow and records its on/off states and every short flow's completion time.

Records: ``samples/cross.jsonl`` (format in docs/CONTRACTS.md; ``ts`` ns since t0 as every record), a per-flow
summary in the trial manifest (``cross_traffic``: delivered bytes, goodput
while on, short flows' count and completion-time percentiles), and a
counter track per flow in the trace.  Rates are IP-level (headers included,
as a link's rate): a ``constant`` TCP flow is paced by the kernel at
``rate`` (``SO_MAX_PACING_RATE``), a UDP flow sends IP packets of the DC's
MTU at ``rate`` whatever the loss.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from traffic_control.errors import ValidationError
from traffic_control.fields import Duration, Rate, Size, SpecModel, unit_field, validate
from traffic_control.units import format_rate, format_time

#: Host part of a DC's cross-traffic endpoint on its LAN (hosts .1-.64, PS .200, probe .250, router .254).
ENDPOINT_HOST = 210
#: OVS port number of its root-side veth (switch: ovs only).
ENDPOINT_OVS_PORT = 98
PORT = 5399
SCRIPT = str(Path(__file__).with_name("cross_gen.py"))
PATTERNS = ("constant", "on_off", "short_flows")
#: Records of every endpoint, merged at the end (one line per record, ``ts`` ns).
RECORDS = "samples/cross.jsonl"


def endpoint_name(dc: str) -> str:
    return f"{dc}-xt"


class CrossFlowSpec(SpecModel):
    """One background flow (or stream of short flows) from one DC to another."""

    src: str = unit_field(..., alias="from", fix="a DC name of the topology, e.g. from: a")
    """the sending DC"""
    dst: str = unit_field(..., alias="to", fix="a DC name of the topology, e.g. to: b")
    """the receiving DC"""
    pattern: Literal["constant", "on_off", "short_flows"] = unit_field(
        ..., fix="one of: constant, on_off, short_flows")
    """constant: one flow for the whole time; on_off: one flow sending during on, idle during off;
    short_flows: Poisson arrivals of size-byte TCP flows"""
    protocol: Literal["tcp", "udp"] = unit_field("tcp", fix="tcp or udp")
    """tcp (congestion-controlled, the DC's algorithm) or udp (unresponsive, needs a rate)"""
    rate: Rate | None = unit_field(None, gt=0, fix="e.g. rate: 20Mbit")
    """constant / on_off: IP-level rate (TCP paced by the kernel; without it TCP takes what it gets)"""
    on_time: Duration | None = unit_field(None, gt=0, fix="e.g. on_time: 2s")
    """on_off: how long each burst lasts (not ``on:``: YAML reads a bare on/off key as a boolean)"""
    off_time: Duration | None = unit_field(None, gt=0, fix="e.g. off_time: 3s")
    """on_off: the pause between bursts"""
    size: Size | None = unit_field(None, ge=1, fix="e.g. size: 200KB")
    """short_flows: bytes each flow carries"""
    arrival_rate: float | None = unit_field(None, gt=0, le=1000, fix="e.g. arrival_rate: 5 (flows per second)")
    """short_flows: mean new flows per second (exponential gaps, seeded)"""
    max_concurrent: int = unit_field(64, ge=1, le=1024, fix="e.g. max_concurrent: 64")
    """short_flows: arrivals while this many are still running are skipped (counted)"""
    start: Duration = unit_field(0.0, ge=0, fix="e.g. start: 5s")
    """when it starts, after the trial's (or the command's) start"""
    duration: Duration | None = unit_field(None, gt=0, fix="e.g. duration: 30s (default: until the end)")
    """how long it runs (default: until the trial ends)"""
    label: str | None = unit_field(None, pattern=r"^[A-Za-z0-9_.-]+$", fix="letters, digits, '_', '-', '.'")
    """its name in records and the trace (default x<index>)"""

    @model_validator(mode="after")
    def _pattern_fields(self) -> CrossFlowSpec:
        if self.src == self.dst:
            raise ValidationError("to", f"from and to are both {self.src!r}",
                                  "cross traffic runs between two DCs: name another DC in to")
        if self.pattern == "on_off" and (self.on_time is None or self.off_time is None):
            raise ValidationError("on_time" if self.on_time is None else "off_time",
                                  "on_off needs both on_time and off_time", "give e.g. on_time: 2s, off_time: 3s")
        if self.pattern != "on_off" and (self.on_time is not None or self.off_time is not None):
            raise ValidationError("on_time" if self.on_time is not None else "off_time",
                                  f"on_time/off_time apply to pattern on_off, not {self.pattern}",
                                  "remove them, or write pattern: on_off")
        if self.pattern == "short_flows":
            for key in ("size", "arrival_rate"):
                if getattr(self, key) is None:
                    raise ValidationError(key, f"short_flows needs {key}",
                                          "give e.g. size: 200KB, arrival_rate: 5")
            if self.protocol != "tcp":
                raise ValidationError("protocol", "short_flows are TCP flows", "remove protocol or write tcp")
            if self.rate is not None:
                raise ValidationError("rate", "short_flows take no rate (each flow runs at what TCP gets)",
                                      "remove rate; set the load with size x arrival_rate")
        else:
            for key in ("size", "arrival_rate"):
                if getattr(self, key) is not None:
                    raise ValidationError(key, f"{key} applies to pattern short_flows, not {self.pattern}",
                                          "remove it, or write pattern: short_flows")
            if self.protocol == "udp" and self.rate is None:
                raise ValidationError("rate", "a UDP flow needs a rate (it has no congestion control)",
                                      "give e.g. rate: 10Mbit, or use protocol: tcp")
        return self


@dataclass(frozen=True)
class CrossFlow:
    """One flow, validated against its topology; SI units."""

    label: str
    src: str
    dst: str
    pattern: str
    protocol: str = "tcp"
    rate_bps: float | None = None
    on_s: float | None = None
    off_s: float | None = None
    size_bytes: int | None = None
    arrival_rate: float | None = None
    max_concurrent: int = 64
    start_s: float = 0.0
    duration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def describe(self) -> str:
        if self.pattern == "on_off":
            what = f"on {format_time(self.on_s or 0)} / off {format_time(self.off_s or 0)}"
        elif self.pattern == "short_flows":
            what = f"{self.arrival_rate:g} flows/s of {self.size_bytes} B"
        else:
            what = "constant"
        if self.rate_bps:
            what += f" at {format_rate(self.rate_bps)}"
        elif self.pattern != "short_flows":
            what += " greedy"
        return f"{self.label}: {self.src}->{self.dst} {self.protocol} {what}"

    @property
    def offered_bps(self) -> float | None:
        """The load it offers on average (None: greedy TCP, whatever it gets)."""
        if self.pattern == "short_flows":
            return (self.size_bytes or 0) * 8 * (self.arrival_rate or 0)
        if self.rate_bps is None:
            return None
        if self.pattern == "on_off":
            return self.rate_bps * (self.on_s or 0) / ((self.on_s or 0) + (self.off_s or 0))
        return self.rate_bps


def parse_cross_traffic(data: Any, dc_names: list[str] | None, field: str = "cross_traffic") -> list[CrossFlow]:
    """Validate a ``cross_traffic:`` list against the topology's DCs (``None``: the flows alone, DC
    names unchecked); errors name ``cross_traffic[i].key``."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise ValidationError(field, f"expected a list of flows, got {type(data).__name__}",
                              "write e.g. cross_traffic: [{from: a, to: b, pattern: constant, rate: 10Mbit}]")
    flows: list[CrossFlow] = []
    labels: set[str] = set()
    for i, item in enumerate(data):
        at = f"{field}[{i}]"
        if isinstance(item, dict):
            for key in item:
                if isinstance(key, bool):  # YAML 1.1 reads bare on/off/yes/no keys as booleans
                    raise ValidationError(f"{at}.{'on' if key else 'off'}", "YAML read this key as a boolean",
                                          "write on_time: / off_time: (a bare on/off key is true/false in YAML)")
        m = validate(CrossFlowSpec, item, at)
        for key, dc in (("from", m.src), ("to", m.dst)):
            if dc_names is not None and dc not in dc_names:
                raise ValidationError(f"{at}.{key}", f"no DC named {dc!r}", f"use one of: {', '.join(dc_names)}")
        label = m.label or f"x{i}"
        if label in labels:
            raise ValidationError(f"{at}.label", f"label {label!r} used twice", "give each flow its own label")
        labels.add(label)
        flows.append(CrossFlow(label, m.src, m.dst, m.pattern, m.protocol, m.rate, m.on_time, m.off_time, m.size,
                               m.arrival_rate, m.max_concurrent, m.start, m.duration))
    return flows


def load_cross_traffic(path: str | Path, dc_names: list[str] | None) -> list[CrossFlow]:
    """A YAML file holding a ``cross_traffic:`` list (or the list itself)."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ValidationError(str(p), f"cannot read: {e.strerror}", "give an existing YAML file") from None
    except yaml.YAMLError as e:
        raise ValidationError(str(p), f"not YAML: {e}", "fix the file's syntax") from None
    if isinstance(data, dict):
        if set(data) != {"cross_traffic"}:
            extra = sorted(set(data) - {"cross_traffic"})
            raise ValidationError(f"{p}:{extra[0] if extra else 'cross_traffic'}", "expected only a cross_traffic: list",
                                  "write cross_traffic: [{from: a, to: b, pattern: constant, rate: 10Mbit}]")
        data = data["cross_traffic"]
    return parse_cross_traffic(data, dc_names)


class CrossTraffic:
    """Run ``flows`` on a running network: endpoints, sinks, senders; records under ``out_dir``.

    ``start()`` returns once every sink and sender is listening/running (flows begin at
    ``t0_ns + start``); ``stop()`` ends the senders, then the sinks, removes the endpoints,
    merges the records into ``samples/cross.jsonl`` and returns the per-flow summary.
    """

    def __init__(self, net: Any, flows: list[CrossFlow], out_dir: Path, t0_ns: int | None = None,
                 seed: int = 1, log: Any = None) -> None:
        self.net, self.flows, self.out_dir = net, flows, Path(out_dir)
        self.t0_ns = t0_ns or time.time_ns()
        self.seed = seed
        self.log = log or (lambda _m: None)
        self._endpoints: list[str] = []
        self._procs: list[tuple[str, subprocess.Popen[str], Path]] = []
        self._readers: dict[int, threading.Thread] = {}
        self.errors: list[str] = []

    # ------------------------------------------------------------------ run
    def _ip(self, dc: str) -> str:
        """The address of ``dc``'s endpoint (shape mode across servers: the DC's server's own)."""
        from .endpoints import endpoint_ip

        own = getattr(self.net, "endpoint_ip", None)
        return own(dc, ENDPOINT_HOST) if own is not None else endpoint_ip(self.net, dc, ENDPOINT_HOST)

    def start(self) -> CrossTraffic:
        (self.out_dir / "samples").mkdir(parents=True, exist_ok=True)
        dcs = sorted({f.src for f in self.flows} | {f.dst for f in self.flows})
        try:
            for dc in dcs:
                self._endpoints.append(self.net.add_endpoint(dc, endpoint_name(dc), ENDPOINT_HOST,
                                                             ENDPOINT_OVS_PORT, as_host=True))
            labels = [f.label for f in self.flows]
            for dc in sorted({f.dst for f in self.flows}):
                self._spawn(dc, "sink", ["--bind", self._ip(dc), "--flows", json.dumps(labels)])
            for dc in sorted({f.src for f in self.flows}):
                mine = [{"index": i, "flow": f.to_dict()} for i, f in enumerate(self.flows) if f.src == dc]
                dsts = {f.dst for f in self.flows if f.src == dc}
                for dst in sorted(dsts):  # one sender per (source, destination): --dst is one address
                    part = [m for m in mine if m["flow"]["dst"] == dst]
                    self._spawn(dc, f"send-{dst}", ["--dst", self._ip(dst),
                                                    "--flows", json.dumps(part),
                                                    "--t0-ns", str(self.t0_ns + self._offset(dc)),
                                                    "--seed", str(self.seed), "--mtu", str(self._mtu(dc, dst))])
        except BaseException:
            self.stop()
            raise
        for f in self.flows:
            self.log(f"cross traffic {f.describe()}")
        return self

    def _mtu(self, src: str, dst: str) -> int:
        """The smallest MTU a packet from src's to dst's LAN crosses (UDP datagrams must not fragment)."""
        topo = self.net.topo
        path = topo.path(src, dst)
        mtus = [topo.dc(src).lan.mtu, topo.dc(dst).lan.mtu]
        mtus += [topo.link(a, b).shape(a, b).mtu for a, b in zip(path, path[1:])]
        return min(mtus)

    def _offset(self, dc: str) -> int:
        """How far the clock of the server holding ``dc``'s endpoint runs off this one's (ns; 0 on one machine):
        a sender's t0 is read on its own clock, and its records' ``ts`` are taken back to this one's."""
        offset = getattr(self.net, "clock_offset_ns", None)
        return int(offset(dc)) if offset is not None else 0

    def _spawn(self, dc: str, what: str, extra: list[str]) -> None:
        """Start a generator in ``dc``'s endpoint; its records come back on its stdout (over ssh when the
        endpoint is on another server) and a thread appends them to its file here."""
        node = endpoint_name(dc)
        out = self.out_dir / "samples" / f"cross-{node}-{what}.jsonl"
        mode = "sink" if what == "sink" else "send"
        argv = [sys.executable, SCRIPT, mode, "--port", str(PORT), "--out", "-", *extra]
        p = self.net.popen(node, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           stdin=subprocess.DEVNULL)
        self._procs.append((f"{node} {what}", p, out))
        early = []  # a flow due already may log before the generator says ready
        line = p.stdout.readline() if p.stdout else ""
        while line.startswith("{"):
            early.append(line)
            line = p.stdout.readline()
        if line.strip() != "ready":
            err = p.stderr.read()[-400:] if p.stderr and p.poll() is not None else ""
            raise RuntimeError(f"cross traffic: {what} in {node} did not start: "
                               f"{line.strip() or err.strip() or 'no output'}")
        with out.open("a", encoding="utf-8") as fh:
            fh.writelines(early)
        t = threading.Thread(target=_copy_lines, args=(p.stdout, out), name=f"cross-{node}-{what}", daemon=True)
        t.start()
        self._readers[id(p)] = t

    def stop(self) -> dict[str, Any]:
        """End everything (senders first, so the sinks see the last bytes), merge and summarize."""
        senders = [p for p in self._procs if " send-" in p[0]]
        sinks = [p for p in self._procs if p not in senders]
        for group in (senders, sinks):
            for _, p, _ in group:
                if p.poll() is None:
                    with _quiet():
                        # on another server: SIGTERM there, its last records still come back over ssh
                        getattr(p, "stop_gracefully", lambda p=p: p.send_signal(signal.SIGTERM))()
            for name, p, _ in group:
                try:
                    p.wait(timeout=8)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                reader = self._readers.pop(id(p), None)
                if reader is not None:
                    reader.join(timeout=10)
                err = p.stderr.read() if p.stderr else ""
                # SIGTERM: -15 here, 143 through `net exec --until-eof` on another server
                if p.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
                    self.errors.append(f"{name} exited {p.returncode}: {(err or '').strip()[-300:]}")
        self._procs_done = list(self._procs)
        self._procs = []
        for name in self._endpoints:
            self.net.remove_endpoint(name, ENDPOINT_OVS_PORT)
        self._endpoints = []
        recs = self._merge()
        return summarize(self.flows, recs, self.t0_ns, self.errors)

    def _merge(self) -> list[dict[str, Any]]:
        recs: list[dict[str, Any]] = []
        parts = sorted((self.out_dir / "samples").glob("cross-*-*.jsonl"))
        for part in parts:
            node = part.stem.split("-", 1)[1].rsplit("-", 1)[0]
            for line in part.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                rec["node"] = node.rsplit("-send", 1)[0]
                t0 = self.t0_ns + self._offset(rec["node"].rsplit("-", 1)[0])  # t0 on the endpoint's clock
                for key in ("ts", "start"):  # the generator's realtime clock -> ns since t0, as every record
                    if isinstance(rec.get(key), int):
                        rec[key] -= t0
                recs.append(rec)
        recs.sort(key=lambda r: r.get("ts", 0))
        with (self.out_dir / RECORDS).open("a") as fh:
            for r in recs:
                fh.write(json.dumps(r, separators=(",", ":")) + "\n")
        for part in parts:
            part.unlink()
        return recs


def _copy_lines(src: Any, out: Path) -> None:
    """A generator's records, line by line as they come, into its file (until its stdout closes)."""
    with out.open("a", encoding="utf-8") as fh:
        for line in src:
            if line.startswith("{"):
                fh.write(line)
                fh.flush()


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is ProcessLookupError


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def summarize(flows: list[CrossFlow], recs: list[dict[str, Any]], t0_ns: int,
              errors: list[str] | None = None) -> dict[str, Any]:
    """Per flow: delivered bytes, time sending (``active_s``), goodput while sending, short flows'
    completion times."""
    out: dict[str, Any] = {"flows": [], "errors": list(errors or [])}
    for f in flows:
        mine = [r for r in recs if r.get("flow") == f.label]
        rx = [r for r in mine if r.get("kind") == "rx"]
        states = [r for r in mine if r.get("kind") == "state"]
        on_s, since = 0.0, None
        for r in states:
            if r.get("on"):
                since = r["ts"]
            elif since is not None:
                on_s += (r["ts"] - since) / 1e9
                since = None
        delivered = max((r["bytes"] for r in rx), default=0)
        row: dict[str, Any] = {**f.to_dict(), "delivered_bytes": delivered, "active_s": round(on_s, 3),
                               "goodput_bps": delivered * 8 / on_s if on_s > 0 else None}
        if f.pattern == "short_flows":
            done = [r for r in mine if r.get("kind") == "short"]
            fct = [r["fct_s"] for r in done]
            last = next((r for r in reversed(states) if "started" in r), {})
            row["short"] = {"started": last.get("started", len(done)), "completed": len(done),
                            "skipped": last.get("skipped", 0), "fct_p50_s": _pct(fct, 0.5),
                            "fct_p99_s": _pct(fct, 0.99), "fct_max_s": max(fct, default=None)}
        errs = [r.get("error") for r in mine if r.get("kind") == "error"]
        if errs:
            row["errors"] = errs[:10]
            out["errors"].append(f"{f.label}: {len(errs)} error(s), first: {errs[0]}")
        out["flows"].append(row)
    return out


def format_summary(summary: dict[str, Any]) -> str:
    rows = [("flow", "path", "pattern", "offered", "time on", "goodput", "short flows (done/started, p50/p99 FCT)")]
    for r in summary["flows"]:
        f = CrossFlow(**{k: r[k] for k in CrossFlow.__dataclass_fields__ if k in r})
        offered = f.offered_bps
        sh = r.get("short")
        short = "-" if not sh else (f"{sh['completed']}/{sh['started']}, "
                                    f"{_ms(sh['fct_p50_s'])}/{_ms(sh['fct_p99_s'])}"
                                    + (f", {sh['skipped']} skipped" if sh["skipped"] else ""))
        rows.append((f.label, f"{f.src}->{f.dst} {f.protocol}", f.pattern,
                     _mbit(offered) if offered else "greedy", f"{r['active_s']:.1f} s",
                     _mbit(r["goodput_bps"]) if r["goodput_bps"] else "-", short))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"error: {e}" for e in summary["errors"]]
    return "\n".join(lines)


def _mbit(bps: float) -> str:
    return f"{bps / 1e6:.2f} Mbit/s"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f} ms"
