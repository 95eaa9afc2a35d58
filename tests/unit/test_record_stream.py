"""RecordStream: a remote scratch directory's record files copied line by line as they grow.

The poll's shell runs for real (``sh`` here, as it would over ssh there) against a directory the test writes
to between polls, the way a trainer appends spans while the launcher polls.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from testbed.cluster.stream import RecordStream


class LocalShell:
    """``Remote.read`` without ssh: the argv runs here."""

    def read(self, argv, timeout=30.0):
        return subprocess.run(argv, capture_output=True, check=True, timeout=timeout).stdout


def as_is(argv):
    return argv


def test_only_complete_lines_are_copied_and_the_rest_follows_on_the_next_poll(tmp_path: Path):
    there, here = tmp_path / "there", tmp_path / "here"
    (there / "events").mkdir(parents=True)
    spans = there / "events" / "b-h1.worker.1.jsonl"
    spans.write_text('{"a": 1}\n{"a": 2}\n{"a"')  # a line being written
    st = RecordStream(str(there), here)
    assert st.poll(LocalShell(), as_is) == 18
    assert (here / "events" / "b-h1.worker.1.jsonl").read_text() == '{"a": 1}\n{"a": 2}\n'
    assert st.size_of("b-h1.worker.1.jsonl") == spans.stat().st_size  # progress: the size there
    with spans.open("a") as fh:
        fh.write(': 3}\n')
    (there / "metrics.csv").write_text("step,loss\n1,2.3\n")
    (there / "samples").mkdir()
    (there / "samples" / "tcp-s2.jsonl").write_text('{"x": 1}\n')
    (there / "procs").mkdir()
    (there / "procs" / "b-h1.worker.1.json").write_text('{"python": "3.11"}\n')  # written once, as it starts
    (there / "procs" / "b-ps.server.2.json").write_text('{"python": "3.1')  # being written: not yet
    st.poll(LocalShell(), as_is)
    assert (here / "events" / "b-h1.worker.1.jsonl").read_bytes() == spans.read_bytes()
    assert (here / "metrics.csv").read_text() == "step,loss\n1,2.3\n"
    assert (here / "samples" / "tcp-s2.jsonl").read_text() == '{"x": 1}\n'
    assert [p.name for p in (here / "procs").iterdir()] == ["b-h1.worker.1.json"]
    assert (here / "procs" / "b-h1.worker.1.json").read_text() == '{"python": "3.11"}\n'
    (there / "procs" / "b-ps.server.2.json").write_text('{"python": "3.11"}\n')
    assert st.poll(LocalShell(), as_is) == 19  # the second process record, whole now
    assert st.poll(LocalShell(), as_is) == 0  # nothing new, nothing appended twice
    assert (here / "events" / "b-h1.worker.1.jsonl").read_bytes() == spans.read_bytes()
    assert (here / "procs" / "b-ps.server.2.json").read_text() == '{"python": "3.11"}\n'
    rep = st.report(t0_ns=0, fetched=False)
    assert rep["streamed_files"] == 5 and rep["streamed_bytes"] == sum(
        f.stat().st_size for f in here.rglob("*") if f.is_file()) and rep["polls"] == 4
    assert rep["streamed_until_s"] > 0 and "streamed" in rep["note"]
    assert "note" not in st.report(t0_ns=0, fetched=True)


def test_any_bytes_survive_the_framing_and_a_shrunk_file_sends_nothing(tmp_path: Path):
    there, here = tmp_path / "there", tmp_path / "here"
    there.mkdir()
    body = bytes(range(256)).replace(b"\n", b"") + b"\n" + b"x" * 70000 + b"\n"
    (there / "metrics.csv").write_bytes(body)
    st = RecordStream(str(there), here)
    st.poll(LocalShell(), as_is)
    assert (here / "metrics.csv").read_bytes() == body
    (there / "metrics.csv").write_bytes(b"short\n")  # never happens to records; must not corrupt the copy
    assert st.poll(LocalShell(), as_is) == 0
    assert (here / "metrics.csv").read_bytes() == body


def test_a_missing_directory_is_empty_and_names_from_elsewhere_are_refused(tmp_path: Path):
    st = RecordStream(str(tmp_path / "gone"), tmp_path / "here")
    assert st.poll(LocalShell(), as_is) == 0 and st.copied == {}
    # what another machine might send: a path out of the trial directory is not written
    assert st.take(b"5 0 ../../etc/x.jsonl\naGVsbG8K\n") == 0
    assert st.take(b"6 0 events/../../x.csv\naGVsbG8K\n") == 0
    assert not list((tmp_path).rglob("x.*"))
    assert st.take(b"6 0 procs/../x.json\naGVsbG8K\n") == 0 and st.take(b"6 0 x.json\naGVsbG8K\n") == 0
    assert st.take(b"6 0 events/ok.jsonl\naGVsbG8K\n") == 6
    assert (tmp_path / "here" / "events" / "ok.jsonl").read_text() == "hello\n"


def test_a_poll_that_fails_is_counted_and_raised(tmp_path: Path):
    class Gone:
        def read(self, argv, timeout=30.0):
            raise RuntimeError("ssh: connection refused")

    st = RecordStream(str(tmp_path), tmp_path / "here")
    try:
        st.poll(Gone(), as_is)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failure must reach the caller")
    assert st.failed_polls == 1 and st.last_ok is None
    assert st.report(t0_ns=0, fetched=False)["streamed_until_s"] is None


def test_a_trial_with_a_servers_records_only_streamed_says_so_where_records_are_read(tmp_path: Path):
    import json

    from testbed.collect.records import read_trial

    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "a-h1.worker.0.jsonl").write_text("")
    (tmp_path / "manifest.json").write_text(json.dumps({"cluster": {"records": {
        "s2": {"fetched": False, "streamed_until_s": 41.5}, "s3": {"fetched": True}}}}))
    problems = read_trial(tmp_path).problems
    assert [p for p in problems if "records of server" in p] == [
        "records of server s2: partial, streamed until 41.5 s after t0 (the server could not be reached at the "
        "trial's end)"]
