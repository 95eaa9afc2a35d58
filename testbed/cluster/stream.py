"""A remote server's trial records copied into the trial directory while the trial runs, line by line.

A trial across servers used to bring a remote server's records home once, at its end (tar over ssh): a server
that disappeared mid-trial took every span, metric and sample it had written with it.  Now the launcher's
progress poll (every ``trialnet.POLL_S`` seconds) also copies what each remote record file gained since the
last poll -- complete lines only, so every copy is a valid prefix of the file there -- into the same path in
the trial directory.  The tar at the end still comes and overwrites the copies with the whole files; where it
cannot (the server is gone), the trial keeps what was streamed, and the manifest says up to when
(``cluster.records``).

Which files: the append-only text records -- spans (``events/*.jsonl``), the remote samplers' rows
(``samples/*.jsonl``), an evaluator's ``metrics.csv`` (a parameter server or rank 0 on that server) -- and the
process records (``procs/*.json``: one line, written once as a process starts, so it comes whole).

One poll is one ``sh`` over the shared ssh connection: for each file, a header line ``<size> <offset> <path>``
and one base64 line of its bytes from ``offset`` (the launcher's count of complete-line bytes copied); base64
keeps the framing line-based whatever a file holds.
"""

from __future__ import annotations

import base64
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The record files streamed, as shell globs relative to the scratch directory.
PATTERNS = ("events/*.jsonl", "samples/*.jsonl", "*.csv", "procs/*.json")
#: A streamed file's name as it may come back: one of :data:`PATTERNS`, no other directory.
_NAME = re.compile(r"^((events/|samples/)?[A-Za-z0-9_.-]+\.(jsonl|csv)|procs/[A-Za-z0-9_.-]+\.json)$")


@dataclass
class RecordStream:
    """One remote server's scratch directory, mirrored into ``into`` as its record files grow."""

    remote_dir: str
    into: Path
    #: path (relative) -> bytes copied, always up to a line end
    copied: dict[str, int] = field(default_factory=dict)
    #: path -> its size there at the last poll (a remote trainer's progress)
    sizes: dict[str, int] = field(default_factory=dict)
    #: wall clock (time.time()) of the last poll that came back
    last_ok: float | None = None
    polls: int = 0
    failed_polls: int = 0

    def script(self) -> str:
        """The shell one poll runs there."""
        cases = "".join(f"{shlex.quote(p)}) o={n};; " for p, n in sorted(self.copied.items()))
        return (f"cd {shlex.quote(self.remote_dir)} 2>/dev/null || exit 0; "
                f"for f in {' '.join(PATTERNS)}; do [ -f \"$f\" ] || continue; "
                "s=$(stat -c %s \"$f\"); "
                f"case \"$f\" in {cases}*) o=0;; esac; "
                "[ \"$s\" -lt \"$o\" ] && o=$s; "  # a file that shrank sends nothing (records only grow)
                "echo \"$s $o $f\"; tail -c +$((o + 1)) \"$f\" | head -c $((s - o)) | base64 -w0; echo; done")

    def take(self, out: bytes) -> int:
        """Append what one poll brought (complete lines) to the copies; the bytes appended."""
        lines = out.decode("ascii", errors="replace").split("\n")
        added = 0
        for header, body in zip(lines[0::2], lines[1::2]):
            parts = header.split(" ", 2)
            if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or not _NAME.match(parts[2]):
                break  # not what the script prints: stop here rather than guess
            size, offset, name = int(parts[0]), int(parts[1]), parts[2]
            self.sizes[name] = size
            if offset != self.copied.get(name, 0):
                continue  # a poll that crossed another (cannot happen: one poller); never append out of place
            data = base64.b64decode(body or b"")
            cut = data.rfind(b"\n") + 1
            if not cut:
                continue
            target = self.into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("ab") as fh:
                fh.write(data[:cut])
            self.copied[name] = offset + cut
            added += cut
        return added

    def poll(self, remote: Any, argv_of: Any, timeout: float = 30.0) -> int:
        """One poll over ``remote`` (``argv_of(script)`` wraps it as the server's user needs); the bytes
        appended.  Its RemoteError goes to the caller, counted."""
        self.polls += 1
        try:
            out = remote.read(argv_of(["sh", "-c", self.script()]), timeout=timeout)
        except Exception:
            self.failed_polls += 1
            raise
        added = self.take(out)
        self.last_ok = time.time()
        return added

    def size_of(self, basename: str) -> int:
        """A span file's size there at the last poll, by its base name (0 before it exists)."""
        return self.sizes.get(f"events/{basename}", 0)

    def report(self, t0_ns: int | None, fetched: bool) -> dict[str, Any]:
        """The manifest's ``cluster.records.<server>``: whether the whole files came at the end, else what was
        streamed and up to when (seconds after the trial's t0, on the launcher's clock)."""
        out: dict[str, Any] = {"fetched": fetched, "streamed_files": len(self.copied),
                               "streamed_bytes": sum(self.copied.values()), "polls": self.polls,
                               "failed_polls": self.failed_polls}
        if not fetched:
            out["streamed_until_s"] = (round(self.last_ok - t0_ns / 1e9, 2)
                                       if self.last_ok is not None and t0_ns is not None else None)
            out["note"] = ("the server could not be reached at the trial's end: its records here are what the "
                           "progress poll copied while it ran (complete lines, up to streamed_until_s)")
        return out
