"""Tolerant record readers."""

from __future__ import annotations

from pathlib import Path

from testbed.collect.records import (
    classify_dir,
    parse_trial_name,
    read_jsonl,
    read_metrics_csv,
)


def test_parse_trial_name() -> None:
    assert parse_trial_name("pgcs-blp-r3") == ("pgcs-blp", 3)
    assert parse_trial_name("odd") == ("odd", None)


def test_read_jsonl_damage(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\nnot json\n[1, 2]\n{"a": 2}\n{"a": 3, "b"')
    recs, probs = read_jsonl(p)
    assert [r["a"] for r in recs] == [1, 2]
    assert any("last line truncated" in m for m in probs)
    assert any("2 unparsable line(s)" in m and "line 2, 3" in m for m in probs)
    assert read_jsonl(tmp_path / "nope.jsonl")[1] == [f"{tmp_path / 'nope.jsonl'}: missing"]
    (tmp_path / "e.jsonl").write_text("")
    assert "empty" in read_jsonl(tmp_path / "e.jsonl")[1][0]


def test_read_metrics_damage(tmp_path: Path) -> None:
    p = tmp_path / "metrics.csv"
    p.write_text("step,wall_s,loss,acc,expert,updates\n1,0.5,2.0,,,1\n2,1.0,1.5,0.4,,2\n3,1.5")
    rows, probs = read_metrics_csv(p)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["acc"] is None and rows[1]["acc"] == 0.4
    assert any("incomplete" in m for m in probs)


def test_classify(tmp_path: Path) -> None:
    assert classify_dir(tmp_path) == "unknown"
    (tmp_path / "exp" / "run" / "trials" / "asp-r0" / "events").mkdir(parents=True)
    assert classify_dir(tmp_path / "exp") == "experiment"
    assert classify_dir(tmp_path / "exp" / "run") == "run"
    assert classify_dir(tmp_path / "exp" / "run" / "trials" / "asp-r0") == "trial"


def test_processes_sharing_the_clock_anchor_agree_when_the_wall_clock_is_slewed_between_their_starts(monkeypatch):
    """Two processes of a trial start seconds apart while the wall clock is being corrected (measured on these
    machines: 5 ms/s for 25 s).  Each reading its own wall-from-monotonic offset, they disagree on "now" by what
    the clock moved in between; sharing the launcher's anchor (the job's ``clock``), they agree exactly."""
    import time

    from testbed.collect.recorder import Recorder, anchored_offset, clock_anchor

    anchor = clock_anchor()
    first = Recorder(None, host="a", role="worker", rank=0, t0_ns=0, flush_interval_s=0,
                     offset_ns=anchored_offset(anchor))
    own_first = Recorder(None, host="a", role="worker", rank=0, t0_ns=0, flush_interval_s=0)
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 40_000_000)  # the wall clock moved 40 ms
    later = Recorder(None, host="b", role="worker", rank=1, t0_ns=0, flush_interval_s=0,
                     offset_ns=anchored_offset(anchor))
    own_later = Recorder(None, host="b", role="worker", rank=1, t0_ns=0, flush_interval_s=0)
    assert later._offset == first._offset  # noqa: SLF001 (one mapping)
    assert abs((own_later._offset - own_first._offset) - 40_000_000) < 5_000_000  # noqa: SLF001 (the defect)
    # another machine (another boot id) cannot use the launcher's mapping: it reads its own
    assert anchored_offset({**anchor, "boot_id": "another-machine"}) is None and anchored_offset(None) is None
