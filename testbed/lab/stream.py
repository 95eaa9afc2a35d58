"""Split the guest's command line (``ttyS1``) into boot noise, output and markers.

Why a small state machine: the command's output reaches the host as one byte
stream that also carries the guest's ``READY``/``DONE`` markers (see
``guest.py``).  The host has to stream the output to the user as it arrives,
never print a marker, and never hold back more than a possible marker prefix.
"""

from __future__ import annotations

import time
from typing import BinaryIO


class ConsoleSplitter:
    """Feed it chunks; it records when the command started and what it printed."""

    def __init__(self, token: str, sink: BinaryIO | None = None) -> None:
        self._ready = f"GEO-LAB-READY {token}\n".encode()
        # The random token makes the marker unmistakable anywhere, so the guest
        # does not need to start it on a fresh line (output stays byte-exact).
        self._done = f"GEO-LAB-DONE {token} ".encode()
        self._sink = sink
        self._pending = b""
        self.boot_text = b""  # what came before READY (init's failure lines)
        self.output = bytearray()
        self.ready_at: float | None = None
        self.done_at: float | None = None
        self.done_status: int | None = None

    def feed(self, chunk: bytes) -> None:
        """Consume bytes read from the guest."""
        self._pending += chunk
        if self.ready_at is None:
            i = self._pending.find(self._ready)
            if i < 0:
                keep = len(self._ready) - 1
                self.boot_text += self._pending[:-keep] if len(self._pending) > keep else b""
                self._pending = self._pending[-keep:] if len(self._pending) > keep else self._pending
                return
            self.boot_text += self._pending[:i]
            self.ready_at = time.monotonic()
            self._pending = self._pending[i + len(self._ready):]
        if self.done_at is not None:
            self._pending = self._pending[-64:]  # only the status digits matter now
            self._parse_status()
            return
        i = self._pending.find(self._done)
        if i >= 0:
            self._emit(self._pending[:i])
            self.done_at = time.monotonic()
            self._pending = self._pending[i + len(self._done):]
            self._parse_status()
            return
        # Hold back only what could still become the DONE marker.
        keep = 0
        for n in range(min(len(self._done) - 1, len(self._pending)), 0, -1):
            if self._done.startswith(self._pending[-n:]):
                keep = n
                break
        self._emit(self._pending[: len(self._pending) - keep])
        self._pending = self._pending[len(self._pending) - keep:]

    def _parse_status(self) -> None:
        line, nl, _rest = self._pending.partition(b"\n")
        if nl and line.strip().isdigit():
            self.done_status = int(line.strip())

    def finish(self) -> None:
        """The stream ended: whatever is held back is output (or boot text)."""
        if self.ready_at is None:
            self.boot_text += self._pending
        elif self.done_at is None:
            self._emit(self._pending)
        self._pending = b""

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        self.output += data
        if self._sink is not None:
            try:
                self._sink.write(data)
                self._sink.flush()
            except (BrokenPipeError, ValueError, OSError):
                # The reader went away (``| head``); keep draining the guest so
                # it never blocks on a full pipe, and keep ``output`` complete.
                self._sink = None
