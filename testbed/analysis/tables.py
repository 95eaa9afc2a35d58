"""Tidy pandas tables from a trial, run or experiment directory.

One row per observation, one column per variable, identity columns first
(``run``, ``trial``, ``scheme``, ``rep``), so pandas users can group and plot
without knowing the record formats.  Every figure is drawn from these tables.

Damage is expected (a crashed run): readers skip torn lines and missing
files and collect the problems in :attr:`Tables.problems` instead of raising.

Definitions used by the per-step breakdown (per worker rank, over the
step's window ``[start of step k, start of step k+1)`` on its main thread):

* compute: time in ``compute`` spans of the worker role;
* exposed sync: time the main thread spends in sync spans (``intra_sync``,
  ``wan_sync``, ``push``, ``pull``) or waiting while this rank's comm
  thread is syncing (PGCS: an expert's unfinished sync), minus compute;
* waiting: the rest of ``wait`` (barriers, SSP bound, stragglers);
* hidden sync: comm-thread time that overlapped compute (the PGCS win);
* other: the remainder of the window (data loading, eval, bookkeeping).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from testbed.analysis.stats import ci95, t95  # noqa: F401 - one implementation, re-exported
from testbed.collect.records import (
    classify_dir,
    read_json,
    read_trial,
    run_dirs,
    trial_dirs,
)

SYNC_PHASES = ("intra_sync", "wan_sync", "push", "pull")
ID_COLS = ["run", "trial", "scheme", "rep"]


@dataclass
class Tables:
    """Raw record tables plus what could not be read."""

    spans: pd.DataFrame
    metrics: pd.DataFrame
    links: pd.DataFrame
    procs: pd.DataFrame
    trials: pd.DataFrame
    problems: list[str] = field(default_factory=list)
    kind: str = "run"
    root: Path | None = None


# --------------------------------------------------------------------------- loading


def _frame(rows: list[dict[str, Any]], ident: dict[str, Any]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame()
    df = pd.DataFrame.from_records(rows)
    df = df.drop(columns=[k for k in ident if k in df.columns])  # the trial's identity wins
    for k, v in reversed(ident.items()):
        df.insert(0, k, v)
    return df


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()


def _sweep(manifest: dict[str, Any]) -> dict[str, Any]:
    sw = manifest.get("sweep")
    if not isinstance(sw, dict):
        return {}
    return {f"sweep_{k}": v for k, v in sw.items() if isinstance(v, (int, float, str, bool))}


def workload_of(manifest: dict[str, Any], trial_dir: Path | None = None) -> str | None:
    """The workload a trial trained (manifest ``training.workload``, else its first job file).

    Comparisons are per workload: a digits classifier and a language model
    share no target, table or axis (see ``report``).
    """
    training = manifest.get("training")
    if not isinstance(training, dict) and trial_dir is not None:
        job, _ = read_json(trial_dir / "jobs" / "0.json")
        training = job.get("training")
    wl = training.get("workload") if isinstance(training, dict) else None
    if isinstance(wl, dict):
        wl = wl.get("name")
    return str(wl) if isinstance(wl, str) else None


def _load_trials(paths: list[Path], run: str, run_manifest: dict[str, Any]) -> Tables:
    spans, metrics, links, procs, trials = [], [], [], [], []
    problems: list[str] = []
    for p in paths:
        tr = read_trial(p)
        ident = {"run": run, "trial": tr.name, "scheme": tr.scheme, "rep": tr.rep}
        prefix = f"{run}/{tr.name}" if run else tr.name
        problems.extend(f"{prefix}/{msg}" for msg in tr.problems)
        s = _frame(tr.spans, ident)
        if not s.empty:
            if "step" in s.columns:
                step = pd.to_numeric(s["step"], errors="coerce")
                whole = step.dropna()
                s["step"] = step.astype("Int64") if (whole == whole.round()).all() else step
            s["start_s"] = s["ts"] / 1e9
            s["end_s"] = (s["ts"] + s["dur"]) / 1e9
        spans.append(s)
        metrics.append(_frame(tr.metrics, dict(ident, workload=workload_of(tr.manifest, p))))
        links.append(_frame(tr.links, ident))
        procs.append(_frame(tr.procs, ident))
        row = dict(ident, path=str(p), n_spans=len(tr.spans), n_metrics=len(tr.metrics),
                   n_link_samples=len(tr.links), n_proc_samples=len(tr.procs),
                   workload=workload_of(tr.manifest, p))
        row.update(_sweep(run_manifest))
        row.update(_sweep(tr.manifest))
        for key in ("predicted_s", "exit_status"):
            if isinstance(tr.manifest.get(key), (int, float, str)):
                row[key] = tr.manifest[key]
        if isinstance(tr.manifest.get("faithful"), bool):  # the self-test and CPU verdict (absent: not checked)
            row["faithful"] = tr.manifest["faithful"]
            row["unfaithful_reasons"] = "; ".join(tr.manifest.get("unfaithful_reasons") or [])
        lr = tr.manifest.get("lr")  # what the processes applied (testbed.training.lr), a list per Gsyn group
        if isinstance(lr, dict) and lr.get("lr") is not None:
            row["lr"] = lr["lr"] if isinstance(lr["lr"], (int, float)) else "/".join(f"{x:g}" for x in lr["lr"])
            row["lr_rule"] = lr.get("rule")
        prov = tr.manifest.get("lr_provenance")
        if isinstance(prov, dict):
            row["lr_source"] = prov.get("source")
            if prov.get("at_edge"):  # the search's pick was the grid's end: the tuning may be incomplete
                row["lr_source"] = f"{prov.get('source')}, {prov['at_edge']} value tried"
        trials.append(row)
    return Tables(_concat(spans), _concat(metrics), _concat(links), _concat(procs),
                  pd.DataFrame(trials), problems)


def load(path: str | Path) -> Tables:
    """Tables of a trial dir, a run dir, or an experiment dir (several runs)."""
    path = Path(path)
    kind = classify_dir(path)
    if kind == "trial":
        t = _load_trials([path], "", {})
    elif kind == "run":
        manifest, probs = read_json(path / "manifest.json", path)
        paths = trial_dirs(path)
        t = _load_trials(paths, path.name, manifest)
        t.problems[:0] = probs
        if not paths:
            t.problems.append(f"{path.name}: trials/ holds no trial directories")
    elif kind == "experiment":
        parts = []
        for rd in run_dirs(path):
            sub = load(rd)
            parts.append(sub)
        t = Tables(*(_concat([getattr(p, a) for p in parts])
                     for a in ("spans", "metrics", "links", "procs", "trials")),
                   problems=[m for p in parts for m in p.problems])
    else:
        t = Tables(*(pd.DataFrame() for _ in range(5)),
                   problems=[f"{path}: not a trial, run or experiment directory"])
    t.kind, t.root = kind, path
    return t


# --------------------------------------------------------------------------- interval helpers


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into sorted disjoint ones."""
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, float)[order], np.asarray(ends, float)[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    out_e = np.maximum.reduceat(e, idx)
    return s[idx], out_e


def _intersect(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray]:
    s_out, e_out = [], []
    i = j = 0
    (as_, ae), (bs, be) = a, b
    while i < len(as_) and j < len(bs):
        lo, hi = max(as_[i], bs[j]), min(ae[i], be[j])
        if lo < hi:
            s_out.append(lo)
            e_out.append(hi)
        if ae[i] < be[j]:
            i += 1
        else:
            j += 1
    return np.array(s_out, float), np.array(e_out, float)


def _subtract(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]
              ) -> tuple[np.ndarray, np.ndarray]:
    """a minus b, both disjoint sorted."""
    s_out, e_out = [], []
    j = 0
    bs, be = b
    for s, e in zip(*a, strict=True):
        cur = s
        while j < len(bs) and be[j] <= cur:
            j += 1
        k = j
        while k < len(bs) and bs[k] < e:
            if bs[k] > cur:
                s_out.append(cur)
                e_out.append(bs[k])
            cur = max(cur, be[k])
            k += 1
        if cur < e:
            s_out.append(cur)
            e_out.append(e)
    return np.array(s_out, float), np.array(e_out, float)


def _measure_in(iv: tuple[np.ndarray, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length of the disjoint sorted interval set ``iv`` inside each window [lo, hi)."""
    s, e = iv
    if len(s) == 0:
        return np.zeros(len(lo))
    cum = np.concatenate([[0.0], np.cumsum(e - s)])

    def upto(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(s, x, side="right")  # intervals starting at or before x
        prev = np.clip(k - 1, 0, len(s) - 1)
        part = np.clip(x - s[prev], 0, e[prev] - s[prev])
        return np.where(k > 0, cum[prev] + part, 0.0)

    return np.maximum(upto(np.asarray(hi, float)) - upto(np.asarray(lo, float)), 0.0)


# --------------------------------------------------------------------------- derived tables


def _ids(df: pd.DataFrame) -> list[str]:
    return [c for c in ID_COLS if c in df.columns]


def step_breakdown(spans: pd.DataFrame) -> pd.DataFrame:
    """Per (trial, worker rank, step): step_s, compute_s, exposed_sync_s, wait_s, hidden_sync_s, other_s."""
    cols = ["step", "step_s", "compute_s", "exposed_sync_s", "wait_s", "hidden_sync_s", "other_s"]
    if spans.empty or "step" not in spans.columns or "rank" not in spans.columns:
        return pd.DataFrame(columns=ID_COLS + ["rank"] + cols)
    ids = _ids(spans)
    out: list[pd.DataFrame] = []
    for key, g in spans.groupby(ids + ["rank"], dropna=False, sort=True):
        main = g[g["role"] == "worker"]
        main = main[main["step"].notna()]
        if main.empty:
            continue
        comm = g[g["role"] == "comm"]

        def iv(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
            return _union(df["start_s"].to_numpy(float), df["end_s"].to_numpy(float))

        comp = iv(main[main["phase"] == "compute"])
        sync = iv(main[main["phase"].isin(SYNC_PHASES)])
        wait = iv(main[main["phase"] == "wait"])
        comm_iv = iv(comm[comm["phase"] != "wait"])
        blocked_on_comm = _intersect(wait, comm_iv)
        exposed = _subtract(iv(pd.DataFrame({
            "start_s": np.concatenate([sync[0], blocked_on_comm[0]]),
            "end_s": np.concatenate([sync[1], blocked_on_comm[1]])})), comp)
        busy = iv(pd.DataFrame({"start_s": np.concatenate([comp[0], sync[0], comm_iv[0]]),
                                "end_s": np.concatenate([comp[1], sync[1], comm_iv[1]])}))
        waiting = _subtract(wait, busy)
        hidden = _intersect(comm_iv, comp)

        per = main.groupby("step").agg(lo=("start_s", "min"), last_end=("end_s", "max"))
        per = per.sort_index()
        lo = per["lo"].to_numpy(float)
        hi = np.append(lo[1:], per["last_end"].to_numpy(float)[-1])
        hi = np.maximum(hi, lo)
        res = pd.DataFrame({
            "step": per.index.to_numpy(),
            "step_s": hi - lo,
            "compute_s": _measure_in(comp, lo, hi),
            "exposed_sync_s": _measure_in(exposed, lo, hi),
            "wait_s": _measure_in(waiting, lo, hi),
            "hidden_sync_s": _measure_in(hidden, lo, hi),
        })
        res["other_s"] = (res["step_s"] - res["compute_s"] - res["exposed_sync_s"]
                          - res["wait_s"]).clip(lower=0.0)
        for name, val in zip(ids + ["rank"], key if isinstance(key, tuple) else (key,), strict=True):
            res.insert(0, name, val)
        out.append(res)
    if not out:
        return pd.DataFrame(columns=ID_COLS + ["rank"] + cols)
    df = pd.concat(out, ignore_index=True)
    return df[ids + ["rank"] + cols]


def staleness(spans: pd.DataFrame) -> pd.DataFrame:
    """One row per applied update that reports staleness (server ``apply`` spans preferred)."""
    if spans.empty or "staleness" not in spans.columns:
        return pd.DataFrame(columns=ID_COLS + ["rank", "staleness"])
    s = spans[spans["staleness"].notna()]
    if (s["role"] == "server").any():
        s = s[s["role"] == "server"]
    keep = _ids(s) + [c for c in ("rank", "step", "group", "version", "start_s", "staleness")
                      if c in s.columns]
    out = s[keep].copy()
    out["staleness"] = pd.to_numeric(out["staleness"], errors="coerce")
    return out.reset_index(drop=True)


def link_rates(links: pd.DataFrame) -> pd.DataFrame:
    """Per sampled interface and interval: direction rates (bit/s), backlog, drops.

    ``direction`` is the link's ``A->B`` for tx bytes; rx bytes of the same
    interface give ``B->A`` and are kept only when no interface samples
    ``B->A`` on its egress (so each direction is counted once).  Backlog and
    drops belong to the egress (tx) side only.
    """
    cols = ["node", "ifname", "link", "direction", "t_s", "dt_s", "rate_bps", "backlog_bytes",
            "qdisc_drops"]
    if links.empty or "tx_bytes" not in links.columns:
        return pd.DataFrame(columns=ID_COLS + cols)
    ids = _ids(links)

    def num(g: pd.DataFrame, col: str) -> np.ndarray:
        if col not in g.columns:
            return np.full(len(g), np.nan)
        return pd.to_numeric(g[col], errors="coerce").to_numpy(float)

    parts: list[pd.DataFrame] = []
    for key, g in links.groupby(ids + ["node", "ifname"], dropna=False, sort=True):
        g = g.sort_values("ts")
        if len(g) < 2:
            continue
        t = g["ts"].to_numpy(float) / 1e9
        dt = np.diff(t)
        link = str(g["link"].iloc[0]) if "link" in g.columns else str(key[-1])
        a, _, b = link.partition("->")
        for d, direction in (("tx", link), ("rx", f"{b}->{a}" if b else f"{link} (rx)")):
            with np.errstate(invalid="ignore", divide="ignore"):
                rate = np.where(dt > 0, np.clip(np.diff(num(g, f"{d}_bytes")), 0, None) * 8 / dt,
                                np.nan)
            nan = np.full(len(dt), np.nan)
            part = pd.DataFrame({
                "node": key[-2], "ifname": key[-1], "link": link, "direction": direction,
                "t_s": t[:-1], "dt_s": dt, "rate_bps": rate,
                "backlog_bytes": num(g, "qdisc_backlog_bytes")[:-1] if d == "tx" else nan,
                "qdisc_drops": num(g, "qdisc_drops")[:-1] if d == "tx" else nan,
                "_src": d,
            })
            for n, v in reversed(list(zip(ids, key[:-2], strict=True))):
                part.insert(0, n, v)
            parts.append(part)
    if not parts:
        return pd.DataFrame(columns=ID_COLS + cols)
    df = pd.concat(parts, ignore_index=True)
    measured = df.loc[df["_src"] == "tx", ids + ["direction"]].drop_duplicates()
    measured["_dup"] = True
    df = df.merge(measured, on=ids + ["direction"], how="left")
    df = df[(df["_src"] == "tx") | df["_dup"].isna()]
    return df.drop(columns=["_src", "_dup"]).reset_index(drop=True)


def time_to_target(m: pd.DataFrame, target_loss: float | None, target_acc: float | None) -> float:
    """THE time to target: wall time of the first evaluation with held-out accuracy >= ``target_acc``
    (or loss <= ``target_loss``) in one trial's metrics; NaN if never reached.  Reports, sweeps and
    benchmarks all use this one definition."""
    if m.empty:
        return math.nan
    m = m.sort_values("wall_s")
    if target_acc is not None and "acc" in m.columns:
        hit = m[pd.to_numeric(m["acc"], errors="coerce") >= target_acc]
    elif target_loss is not None and "loss" in m.columns:
        hit = m[pd.to_numeric(m["loss"], errors="coerce") <= target_loss]
    else:
        return math.nan
    return float(hit["wall_s"].iloc[0]) if not hit.empty else math.nan


def default_target(metrics: pd.DataFrame) -> tuple[float | None, str]:
    """The held-out loss every trial reached: the worst trial's best loss.

    Used when neither the command line nor a manifest names a target.
    """
    if metrics.empty or "loss" not in metrics.columns:
        return None, "no metrics"
    best = metrics.assign(loss=pd.to_numeric(metrics["loss"], errors="coerce")).groupby(
        [c for c in ("run", "trial") if c in metrics.columns])["loss"].min().dropna()
    if best.empty:
        return None, "no loss values"
    return float(best.max()), "loss every trial reached (worst trial's best held-out loss)"


def trial_summary(t: Tables, target_loss: float | None = None,
                  target_acc: float | None = None) -> pd.DataFrame:
    """One row per trial: time to target, throughput, sync share, staleness, WAN bytes."""
    if t.trials.empty:
        return pd.DataFrame()
    steps = step_breakdown(t.spans)
    stale = staleness(t.spans)
    rows = []
    for _, tr in t.trials.iterrows():
        key = {c: tr[c] for c in ("run", "trial")}

        def sel(df: pd.DataFrame, key: dict[str, Any] = key) -> pd.DataFrame:
            if df.empty:
                return df
            mask = np.ones(len(df), bool)
            for c, v in key.items():
                if c in df.columns:
                    mask &= (df[c] == v).to_numpy()
            return df[mask]

        row: dict[str, Any] = {c: tr[c] for c in ID_COLS if c in tr.index}
        if "workload" in tr.index:
            row["workload"] = tr["workload"]
        row.update({c: tr[c] for c in tr.index if str(c).startswith("sweep_")})
        for c in ("predicted_s", "lr", "lr_rule", "lr_source", "faithful", "unfaithful_reasons"):
            if c in tr.index:
                row[c] = tr[c]
        sp, st, m = sel(t.spans), sel(steps), sel(t.metrics)
        workers = sp[sp["role"] == "worker"] if not sp.empty else sp
        dur = float(workers["end_s"].max() - workers["start_s"].min()) if not workers.empty \
            else math.nan
        row["duration_s"] = dur
        row["worker_steps"] = len(st)
        row["steps_per_s"] = len(st) / dur if dur and dur > 0 and len(st) else math.nan
        row["mean_step_s"] = float(st["step_s"].mean()) if len(st) else math.nan
        total = float(st["step_s"].sum()) if len(st) else 0.0
        for part in ("compute", "exposed_sync", "wait", "hidden_sync"):
            row[f"{part}_share"] = float(st[f"{part}_s"].sum()) / total if total > 0 else math.nan
        row["compute_utilization"] = compute_utilization(st, dur)
        row["start_skew_s"] = start_skew(workers)
        if not m.empty and "updates" in m.columns and m["updates"].notna().any():
            last = m.sort_values("wall_s").dropna(subset=["updates"]).iloc[-1]
            row["updates_per_s"] = float(last["updates"]) / float(last["wall_s"]) \
                if last["wall_s"] > 0 else math.nan
        else:
            row["updates_per_s"] = math.nan
        row["final_loss"] = float(m.sort_values("wall_s")["loss"].dropna().iloc[-1]) \
            if not m.empty and "loss" in m.columns and m["loss"].notna().any() else math.nan
        row["time_to_target_s"] = time_to_target(m, target_loss, target_acc)
        s_st = sel(stale)
        row["mean_staleness"] = float(s_st["staleness"].mean()) if len(s_st) else math.nan
        row["wan_bytes"] = _wan_bytes(sel(t.links))
        if not sp.empty and "wan_bytes" in sp.columns:
            # spans that say how many of their bytes crossed DCs (ring successor, server in another DC)
            row["wan_bytes_spans"] = float(pd.to_numeric(sp["wan_bytes"], errors="coerce").fillna(0).sum())
        elif not sp.empty and "bytes" in sp.columns:
            wan = sp[sp["phase"] == "wan_sync"]
            row["wan_bytes_spans"] = float(pd.to_numeric(wan["bytes"], errors="coerce").sum())
        else:
            row["wan_bytes_spans"] = math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def start_skew(workers: pd.DataFrame) -> float:
    """Spread of the workers' first spans after the start barrier (latest first start - earliest).

    Time to target counts from the barrier; a comparison is only as sharp as the workers' common
    start, so a target should take many times this (the claims campaign asks for >= 10x).
    """
    if workers.empty or "rank" not in workers.columns:
        return math.nan
    first = workers.groupby("rank")["start_s"].min()
    return float(first.max() - first.min()) if len(first) else math.nan


def compute_utilization(steps: pd.DataFrame, duration_s: float) -> float:
    """Time the workers spent computing over the trial's wall time, averaged over workers.

    The measure cross-continent training reports give (e.g. INTELLECT-1's "compute utilization"):
    every worker's compute time (``step_breakdown``'s ``compute_s``, summed over its steps), divided by
    the number of workers x the trial's wall time (first worker span to last).  A scheme that hides its
    synchronization behind compute, or rarely synchronizes (local SGD), scores near 1; one that waits
    on the WAN or a straggler every step scores low.  Unlike ``compute_share`` it counts time outside
    any step (rendezvous, a worker idle after finishing its steps) as not computing, so schemes whose
    workers stop at different times are compared on one clock.
    """
    if steps.empty or not duration_s or not math.isfinite(duration_s) or duration_s <= 0:
        return math.nan
    workers = steps["rank"].nunique()
    return float(steps["compute_s"].sum()) / (workers * duration_s) if workers else math.nan


def _wan_bytes(links: pd.DataFrame) -> float:
    """Bytes sent over all sampled WAN egresses (last minus first cumulative tx counter)."""
    if links.empty or "tx_bytes" not in links.columns:
        return math.nan
    tot = 0.0
    for _, g in links.groupby(["node", "ifname"]):
        x = pd.to_numeric(g.sort_values("ts")["tx_bytes"], errors="coerce").dropna()
        if len(x) >= 2:
            tot += max(float(x.iloc[-1] - x.iloc[0]), 0.0)
    return tot


SUMMARY_METRICS = ["time_to_target_s", "steps_per_s", "updates_per_s", "compute_utilization", "exposed_sync_share",
                   "wait_share", "mean_staleness", "wan_bytes", "final_loss", "start_skew_s"]


def scheme_summary(trials: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """Per scheme (and sweep value, if given in ``by``): mean, CI half-width and n of each metric."""
    if trials.empty:
        return pd.DataFrame()
    by = by or ["scheme"]
    rows = []
    for key, g in trials.groupby(by, dropna=False, sort=True):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        row["trials"] = len(g)
        for m in SUMMARY_METRICS:
            if m not in g.columns:
                continue
            mean, hw, n = ci95(g[m])
            row[m], row[f"{m}_ci95"], row[f"{m}_n"] = mean, hw, n
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- writing


def _arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            out[c] = out[c].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v))
                                else str(v))
    return out


def write_tables(named: dict[str, pd.DataFrame], out_dir: Path) -> tuple[list[Path], list[str]]:
    """Write each table as CSV, and as Parquet when pyarrow is importable."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        import pyarrow  # noqa: F401
        parquet = True
    except ImportError:
        parquet = False
    written: list[Path] = []
    problems: list[str] = []
    for name, df in named.items():
        p = out_dir / f"{name}.csv"
        df.to_csv(p, index=False)
        written.append(p)
        if not parquet:
            continue
        q = out_dir / f"{name}.parquet"
        try:
            df.to_parquet(q, index=False)
        except Exception:
            try:
                _arrow_safe(df).to_parquet(q, index=False)
            except Exception as exc:
                problems.append(f"tables/{name}.parquet: not written ({type(exc).__name__}: {exc})")
                continue
        written.append(q)
    if not parquet:
        problems.append("tables: pyarrow not installed, Parquet skipped (CSV written)")
    return written, problems


def workloads(t: Tables) -> list[str | None]:
    """The workloads of ``t``'s trials, in first-seen order (``[None]`` when unknown)."""
    if t.trials.empty or "workload" not in t.trials.columns:
        return [None]
    seen = list(dict.fromkeys(None if pd.isna(w) else str(w) for w in t.trials["workload"]))
    return seen or [None]


def select_trials(t: Tables, keys: set[tuple[str, str]]) -> Tables:
    """The part of ``t`` that belongs to the trials ``keys`` ((run, trial) pairs)."""
    return Tables(*(select_rows(df, keys) for df in (t.spans, t.metrics, t.links, t.procs, t.trials)),
                  list(t.problems), t.kind, t.root)


def select_rows(df: pd.DataFrame, keys: set[tuple[str, str]]) -> pd.DataFrame:
    """The rows of a per-trial table (``run`` and ``trial`` columns) whose trial is one of ``keys``."""
    if df.empty or "trial" not in df.columns or "run" not in df.columns:
        return df
    mask = [(r, tr) in keys for r, tr in zip(df["run"], df["trial"], strict=True)]
    return df[mask].reset_index(drop=True)


def select_workload(t: Tables, workload: str | None) -> Tables:
    """The part of ``t`` whose trials trained ``workload`` (all of it for None or a single workload)."""
    if workload is None or "workload" not in t.trials.columns or t.trials["workload"].nunique(dropna=False) <= 1:
        return t
    keep = t.trials[t.trials["workload"] == workload]
    return select_trials(t, set(zip(keep["run"], keep["trial"], strict=True)))


def all_tables(t: Tables, target_loss: float | None = None,
               target_acc: float | None = None) -> dict[str, pd.DataFrame]:
    """Every tidy table ``testbed report`` writes, by file stem."""
    trials = trial_summary(t, target_loss, target_acc)
    return {
        "spans": t.spans,
        "metrics": t.metrics,
        "link_samples": t.links,
        "link_rates": link_rates(t.links),
        "proc_samples": t.procs,
        "steps": step_breakdown(t.spans),
        "staleness": staleness(t.spans),
        "trials": trials,
        "summary": scheme_summary(trials),
    }
