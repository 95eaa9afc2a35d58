"""Chrome trace merge and its validator."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from testbed.collect.trace import build_trace, load_trace, merge_trial, validate_trace, write_trace
from tests.analysis.fakes import write_trial

MS = 1_000_000


def _s(ts: float, dur: float, phase: str, role: str = "worker", rank: int = 0, host: str = "h0",
       step: int | None = 0, **extra: object) -> dict:
    rec = {"ts": int(ts * MS), "dur": int(dur * MS), "host": host, "dc": "dc1", "rank": rank,
           "role": role, "phase": phase, "step": step}
    rec.update(extra)
    return rec


def _tracks(obj: dict) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in obj["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_fake_trials_produce_valid_traces(tmp_path: Path) -> None:
    for scheme in ("bsp-hier", "gsyn", "pgcs"):
        d = write_trial(tmp_path / scheme, scheme, 0, steps=6)
        path, problems = merge_trial(d)
        assert path is not None and path.name == "trace.json"
        assert problems == []
        obj = load_trace(path)
        assert validate_trace(obj) == []
        phs = {e["ph"] for e in obj["traceEvents"]}
        assert {"X", "C", "M"} <= phs
        names = {e["args"]["name"] for e in obj["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
        assert "h0 (dc1)" in names and "r1 (links)" in names
        counters = {e["name"] for e in obj["traceEvents"] if e["ph"] == "C"}
        assert {"dc1->dc2 rate", "dc1->dc2 queue", "dc1->dc2 qdisc", "worker 0 cpu",
                "worker 0 memory"} <= counters
        rate = next(e for e in obj["traceEvents"] if e["ph"] == "C" and e["name"] == "dc1->dc2 rate")
        assert set(rate["args"]) == {"tx_Mbps", "rx_Mbps"}
        # non-metadata events sorted by time
        ts = [e["ts"] for e in obj["traceEvents"] if e["ph"] != "M"]
        assert ts == sorted(ts)


def test_overlapping_roles_get_separate_tracks() -> None:
    obj = build_trace([
        _s(0, 50, "compute"),
        _s(10, 60, "wan_sync", role="comm"),   # PGCS comm thread overlaps compute
        _s(50, 5, "intra_sync"),
    ])
    assert validate_trace(obj) == []
    names = set(_tracks(obj).values())
    assert {"compute", "comm thread", "intra-DC sync"} <= names


def test_overlap_within_a_class_spills_to_a_lane() -> None:
    obj = build_trace([_s(0, 50, "wan_sync"), _s(10, 10, "wan_sync"), _s(60, 5, "wan_sync")])
    assert validate_trace(obj) == []
    assert sorted(_tracks(obj).values()) == ["WAN sync", "WAN sync #2"]


def test_several_ranks_on_one_host_are_named_apart() -> None:
    obj = build_trace([_s(0, 5, "compute", rank=0), _s(0, 5, "compute", rank=1)])
    assert sorted(_tracks(obj).values()) == ["worker 0: compute", "worker 1: compute"]


def test_validator_catches_problems() -> None:
    base = {"ph": "X", "name": "a", "pid": 1, "tid": 1}
    overlap = [dict(base, ts=0, dur=10), dict(base, ts=5, dur=10)]
    assert any("overlaps" in e for e in validate_trace({"traceEvents": overlap}))
    backwards = [dict(base, ts=10, dur=1), dict(base, ts=5, dur=1)]
    assert any("before previous" in e for e in validate_trace(backwards))
    missing = [{"ph": "X", "name": "a", "ts": 0, "dur": 1, "pid": 1}]
    assert any("tid" in e for e in validate_trace(missing))
    assert any("ph" in e for e in validate_trace([{"name": "x", "ts": 0, "pid": 1}]))
    assert any("B without E" in e for e in validate_trace(
        [{"ph": "B", "name": "a", "ts": 0, "pid": 1, "tid": 1}]))
    bad_counter = [{"ph": "C", "name": "c", "ts": 0, "pid": 1, "args": {"v": "high"}}]
    assert any("counter" in e for e in validate_trace(bad_counter))
    assert validate_trace("nope")
    touching = [dict(base, ts=0, dur=10), dict(base, ts=10, dur=10)]
    assert validate_trace(touching) == []


def test_gzip_over_threshold(tmp_path: Path) -> None:
    obj = build_trace([_s(i, 0.5, "compute", step=i) for i in range(200)])
    p = write_trace(obj, tmp_path, gzip_threshold=1000)
    assert p.name == "trace.json.gz"
    assert json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]
    p2 = write_trace(obj, tmp_path)
    assert p2.name == "trace.json" and not (tmp_path / "trace.json.gz").exists()


def test_crashed_trial_still_merges(tmp_path: Path) -> None:
    d = write_trial(tmp_path / "t", "asp", 0, steps=4)
    ev = sorted((d / "events").glob("*.jsonl"))[0]
    ev.write_text(ev.read_text()[:-20])
    (d / "samples" / "links.jsonl").unlink()
    path, problems = merge_trial(d)
    assert path is not None and validate_trace(load_trace(path)) == []
    assert any("truncated" in p for p in problems)
    assert any("links.jsonl: missing" in p for p in problems)


def test_empty_trial(tmp_path: Path) -> None:
    path, problems = merge_trial(tmp_path)
    assert path is None and any("nothing to merge" in p for p in problems)


def test_clock_offsets_applied() -> None:
    obj = build_trace([_s(10, 1, "compute", host="far")], clock_offsets_ns={"far": 5 * MS})
    x = [e for e in obj["traceEvents"] if e["ph"] == "X"][0]
    assert x["ts"] == 5000.0
