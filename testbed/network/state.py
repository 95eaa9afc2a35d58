"""The running network's record: ``/run/geo-testbed/net.json``.

A network outlives the command that built it (``testbed net up`` returns,
the network stays), so everything a later process needs to find, change,
show or enter it is written here: the topology, the impairment backend and
seed, every node (namespace, role, DC, address, cgroup), the *current* shape
of every WAN direction (``net set`` and link schedules update it) and where
each userspace impairment daemon keeps its state.

Writes are atomic (write aside, rename) and read-modify-write updates hold
an exclusive lock, so a ``net set`` racing a schedule never loses a change.
``testbed clean`` removes the directory with everything else.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from traffic_control.files import write_json_atomic

from . import naming

STATE_FILE = "net.json"
LOCK_FILE = ".lock"
VERSION = 2


def state_dir() -> Path:
    return Path(naming.STATE_DIR)


def path() -> Path:
    return state_dir() / STATE_FILE


def read() -> dict[str, Any] | None:
    """The record of the network that is up, or None (none is up, or the record is unreadable)."""
    try:
        return json.loads(path().read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write(data: dict[str, Any]) -> None:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path(), data, indent=2)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    d = state_dir()
    d.mkdir(parents=True, exist_ok=True)
    with open(d / LOCK_FILE, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write(data: dict[str, Any]) -> None:
    data = dict(data, version=VERSION)
    with _locked():
        _write(data)


def update(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any] | None:
    """Apply ``fn`` to the record in place under the lock; returns the new record (None: no network)."""
    with _locked():
        data = read()
        if data is None:
            return None
        fn(data)
        _write(data)
        return data


def remove_stale() -> None:
    """Remove the record (and the daemons' state dirs) of a network that is no longer up.

    Only called when no ``tb-*`` namespace exists, i.e. nothing can still use it.
    """
    import shutil

    d = state_dir()
    if d.exists():
        shutil.rmtree(d, ignore_errors=True)
