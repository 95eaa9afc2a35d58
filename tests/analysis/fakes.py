"""Realistic record directories written in the contract formats (docs/CONTRACTS.md).

A tiny discrete simulation of each scheme's step structure (2 DCs x N
workers) produces spans, metrics, link samples and process samples, so
tables, trace and figures can be exercised without running training.
"""

from __future__ import annotations

import json
import math
import random
import zlib
from pathlib import Path
from typing import Any

MS = 1_000_000  # ns


class _Trial:
    def __init__(self, scheme: str, rep: int, workers: int, steps: int, seed: int,
                 wan_ms: float, groups: int | None) -> None:
        self.scheme, self.rep, self.workers, self.steps = scheme, rep, workers, steps
        self.rng = random.Random(seed)
        self.wan_ms, self.groups = wan_ms, groups
        self.spans: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        self.wan_activity: list[tuple[int, int, int, str]] = []  # (start, end, bytes, direction)
        self.updates = 0

    def host(self, r: int) -> tuple[str, str]:
        dc = "dc1" if r < self.workers // 2 else "dc2"
        return f"h{r}", dc

    def span(self, r: int, role: str, phase: str, ts: float, dur: float, step: int | None,
             **extra: Any) -> None:
        h, dc = (("ps", "dc1") if role == "server" else self.host(r))
        rec = {"ts": int(ts), "dur": int(max(dur, 0)), "host": h, "dc": dc, "rank": r,
               "role": role, "phase": phase, "step": step, "scheme": self.scheme}
        rec.update(extra)
        self.spans.setdefault((h, role, r), []).append(rec)

    def compute_ms(self) -> float:
        return 40 + self.rng.expovariate(1 / 8)

    def wan(self, start: float, dur: float, nbytes: int) -> None:
        self.wan_activity.append((int(start), int(start + dur), nbytes, "dc1->dc2"))
        self.wan_activity.append((int(start), int(start + dur), nbytes, "dc2->dc1"))

    def simulate(self) -> int:
        s = self.scheme
        grad = 4_000_000
        t = [0.0] * self.workers
        if s in ("bsp-ring", "sequential", "bsp-hier"):
            for k in range(self.steps):
                ends = []
                for r in range(self.workers):
                    c = self.compute_ms() * MS
                    self.span(r, "worker", "compute", t[r], c, k)
                    ends.append(t[r] + c)
                barrier = max(ends)
                wan = (self.wan_ms + self.rng.uniform(0, 10)) * MS
                for r in range(self.workers):
                    if s == "bsp-hier":
                        self.span(r, "worker", "intra_sync", ends[r], barrier - ends[r] + 5 * MS, k,
                                  bytes=grad)
                        if r in (0, self.workers // 2):
                            self.span(r, "worker", "wan_sync", barrier + 5 * MS, wan * 0.6, k,
                                      bytes=grad, peer=self.workers // 2 - r)
                        else:
                            self.span(r, "worker", "wait", barrier + 5 * MS, wan * 0.6, k)
                        self.span(r, "worker", "intra_sync", barrier + 5 * MS + wan * 0.6, 5 * MS,
                                  k, bytes=grad)
                        t[r] = barrier + 10 * MS + wan * 0.6
                    else:
                        self.span(r, "worker", "wan_sync", ends[r], barrier - ends[r] + wan, k,
                                  bytes=2 * grad)
                        t[r] = barrier + wan
                self.wan(barrier, (wan * 0.6 if s == "bsp-hier" else wan), grad)
                self.updates += 1
        elif s in ("asp", "ssp", "gsyn"):
            version = 0
            last_seen = [0] * self.workers
            n_groups = self.groups or 2
            for k in range(self.steps):
                order = sorted(range(self.workers), key=lambda r: t[r])
                for r in order:
                    c = self.compute_ms() * MS
                    self.span(r, "worker", "compute", t[r], c, k)
                    t[r] += c
                    if s == "ssp" and self.rng.random() < 0.2:
                        w = self.rng.uniform(5, 20) * MS
                        self.span(r, "worker", "wait", t[r], w, k)
                        t[r] += w
                    if s == "gsyn":
                        self.span(r, "worker", "intra_sync", t[r], 8 * MS, k, bytes=grad,
                                  group=r % n_groups)
                        t[r] += 8 * MS
                    push = (self.wan_ms * 0.5 + self.rng.uniform(0, 5)) * MS
                    self.span(r, "worker", "push", t[r], push, k, bytes=grad, version=last_seen[r])
                    self.span(-1, "server", "apply", t[r] + push, 2 * MS, None,
                              staleness=version - last_seen[r], version=version, peer=r)
                    self.wan(t[r], push, grad // 2)
                    version += 1
                    self.updates += 1
                    pull = (self.wan_ms * 0.5) * MS
                    self.span(r, "worker", "pull", t[r] + push + 2 * MS, pull, k, bytes=0,
                              version=version)
                    last_seen[r] = version
                    t[r] += push + 2 * MS + pull
        elif s in ("pgcs", "pgcs-blp"):
            # expert e's sync runs on the comm thread while the next expert computes;
            # compute of e waits only for e's previous sync (E = 2)
            experts = 2
            comm_free = [0.0] * self.workers
            ready = [[0.0] * experts for _ in range(self.workers)]
            for k in range(self.steps):
                e = k % experts
                sync_ms = self.wan_ms * (0.8 if s == "pgcs-blp" else 1.1)
                for r in range(self.workers):
                    if ready[r][e] > t[r]:
                        self.span(r, "worker", "wait", t[r], ready[r][e] - t[r], k, expert=e)
                        t[r] = ready[r][e]
                    c = self.compute_ms() * MS
                    self.span(r, "worker", "compute", t[r], c, k, expert=e)
                    t[r] += c
                    start = max(t[r], comm_free[r])
                    d = (sync_ms + self.rng.uniform(0, 10)) * MS
                    self.span(r, "comm", "wan_sync", start, d, k, expert=e, bytes=grad)
                    comm_free[r] = start + d
                    ready[r][e] = start + d
                self.wan(min(t), sync_ms * MS, grad)
                self.updates += 1
        return int(max(t))


def write_trial(trial_dir: Path, scheme: str, rep: int, *, workers: int = 4, steps: int = 30,
                wan_ms: float = 60.0, groups: int | None = None, seed: int | None = None,
                manifest: dict[str, Any] | None = None) -> Path:
    """Write one trial's records; returns the trial dir."""
    seed = seed if seed is not None else zlib.crc32(f"{scheme}-{rep}".encode()) % 10_000
    tr = _Trial(scheme, rep, workers, steps, seed, wan_ms, groups)
    end_ns = tr.simulate()
    (trial_dir / "events").mkdir(parents=True, exist_ok=True)
    for (host, role, rank), recs in tr.spans.items():
        recs.sort(key=lambda r: r["ts"])
        path = trial_dir / "events" / f"{host}.{role}.{rank}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    # metrics: held-out loss decays with updates, noisy
    rng = random.Random(seed + 1)
    rows = ["step,wall_s,loss,acc,expert,updates"]
    speed = {"asp": 0.8, "ssp": 0.9, "gsyn": 0.95}.get(scheme, 1.0)
    n_eval = 12
    for i in range(1, n_eval + 1):
        frac = i / n_eval
        upd = int(tr.updates * frac)
        loss = 2.3 * math.exp(-upd * speed / (tr.updates / 2.5)) + 0.1 + rng.uniform(-0.02, 0.02)
        acc = min(0.99, 1 - loss / 2.5)
        expert = str(i % 2) if scheme.startswith("pgcs") else ""
        rows.append(f"{int(steps * frac)},{end_ns * frac / 1e9:.4f},{loss:.4f},{acc:.4f},"
                    f"{expert},{upd}")
    (trial_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
    # link samples at 10 Hz on both routers
    (trial_dir / "samples").mkdir(exist_ok=True)
    lines, cum = [], {"dc1->dc2": 0.0, "dc2->dc1": 0.0}
    rx = {"dc1->dc2": 0.0, "dc2->dc1": 0.0}
    period = 100 * MS
    for ts in range(0, end_ns + period, period):
        for direction, node, ifname in (("dc1->dc2", "r1", "r1-eth1"), ("dc2->dc1", "r2", "r2-eth1")):
            active = [a for a in tr.wan_activity if a[3] == direction and a[0] < ts + period
                      and a[1] > ts]
            sent = sum(b * min(1.0, period / max(e - s, 1)) for s, e, b, _ in active)
            cum[direction] += sent
            rev = "dc2->dc1" if direction == "dc1->dc2" else "dc1->dc2"
            backlog = int(rng.uniform(20_000, 120_000)) if active else 0
            lines.append(json.dumps({
                "ts": ts, "node": node, "ifname": ifname, "link": direction,
                "tx_bytes": int(cum[direction] * 1.04), "tx_packets": int(cum[direction] / 1448),
                "rx_bytes": int(rx[rev]), "rx_packets": int(rx[rev] / 1448), "drops": 0,
                "qdisc_backlog_bytes": backlog, "qdisc_backlog_pkts": backlog // 1514,
                "qdisc_drops": 0}))
        rx = dict(cum)
    (trial_dir / "samples" / "links.jsonl").write_text("\n".join(lines) + "\n")
    plines = []
    for ts in range(0, end_ns, 100 * MS):
        for r in range(workers):
            h, _ = tr.host(r)
            plines.append(json.dumps({"ts": ts, "host": h, "role": "worker", "rank": r,
                                      "pid": 1000 + r, "cpu_percent": rng.uniform(60, 100),
                                      "rss_bytes": 300_000_000 + r}))
    (trial_dir / "samples" / "procs.jsonl").write_text("\n".join(plines) + "\n")
    man = {"scheme": scheme, "rep": rep, "seed": seed, "t0_ns": 1_700_000_000_000_000_000}
    man.update(manifest or {})
    (trial_dir / "manifest.json").write_text(json.dumps(man))
    return trial_dir


ALL_SCHEMES = ("bsp-ring", "bsp-hier", "asp", "ssp", "gsyn", "pgcs", "pgcs-blp")


def write_run(run_dir: Path, schemes: tuple[str, ...] = ALL_SCHEMES, reps: int = 2,
              manifest: dict[str, Any] | None = None, **kw: Any) -> Path:
    """A run directory: manifest + trials/<scheme>-r<rep>/ for each scheme and repetition."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "manifest.json").write_text(json.dumps(dict(manifest or {}, schemes=list(schemes))))
    for s in schemes:
        for r in range(reps):
            write_trial(run_dir / "trials" / f"{s}-r{r}", s, r, **kw)
    return run_dir


def truncate_run(run_dir: Path) -> None:
    """Damage a run like a crash would: torn JSON lines, a missing metrics.csv, a torn CSV row."""
    trials = sorted((run_dir / "trials").iterdir())
    ev = sorted((trials[0] / "events").glob("*.jsonl"))[0]
    data = ev.read_text()
    ev.write_text(data[: len(data) - 37])  # half-written last line
    (trials[1] / "metrics.csv").unlink()
    links = trials[2] / "samples" / "links.jsonl"
    links.write_text(links.read_text()[:-50])
    m = trials[3] / "metrics.csv"
    m.write_text(m.read_text()[:-9])
    (trials[4] / "samples" / "procs.jsonl").unlink()
    (trials[5] / "manifest.json").write_text('{"scheme": "pg')
