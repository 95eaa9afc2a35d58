"""Per-host CPU shares through cgroups (v2 where mounted, else v1 ``cpu``).

Mininet's CPULimitedHost needs cgroup-tools and cgroup v1; this module writes
the cgroup files directly, works with both hierarchies, and names every group
``tb-<node>`` so that cleanup can find it.

A limit only binds processes *in* the cgroup, and entering a host's
namespaces (``mnexec -da``, ``ip netns exec``) does not put a process there
(measured: a busy loop started through Mininet's ``popen`` in a host limited
to 0.2 cores used 3.0 CPU-seconds in 3 s).  So every process the testbed
starts in a host joins the host's cgroup itself, before it execs
(:func:`preexec`), and ``testbed net exec`` does the same.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from . import naming

V2_ROOT = Path("/sys/fs/cgroup")
V1_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def _base() -> tuple[Path, int] | None:
    if (V2_ROOT / "cgroup.controllers").exists():
        return V2_ROOT, 2
    if (V1_CPU / "cpu.cfs_quota_us").exists():
        return V1_CPU, 1
    return None


def available() -> bool:
    return _base() is not None


def limit(node: str, pid: int, cores: float) -> str:
    """Cap ``pid`` (and its future children) at ``cores`` CPUs; returns the cgroup path."""
    base = _base()
    if base is None:
        raise RuntimeError("no cgroup cpu controller mounted (cgroup v2 at /sys/fs/cgroup or v1 cpu)")
    root, version = base
    path = root / naming.cgroup_name(node)
    path.mkdir(exist_ok=True)
    quota = max(1000, int(cores * PERIOD_US))
    if version == 2:
        (path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        (path / "cgroup.procs").write_text(f"{pid}\n")
    else:
        (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (path / "tasks").write_text(f"{pid}\n")
    return str(path)


def procs_file(node: str) -> Path | None:
    """The file a process writes ``0`` into to join ``node``'s cgroup; None if it has none."""
    base = _base()
    if base is None:
        return None
    root, version = base
    path = root / naming.cgroup_name(node) / ("cgroup.procs" if version == 2 else "tasks")
    return path if path.exists() else None


def join(procs: Path | str) -> None:
    """Move the calling process into the cgroup of ``procs`` (its children follow)."""
    fd = os.open(str(procs), os.O_WRONLY)
    try:
        os.write(fd, b"0\n")
    finally:
        os.close(fd)


def preexec(node: str) -> Callable[[], None] | None:
    """A ``preexec_fn`` that puts the new process into ``node``'s cgroup before it execs.

    Runs in the forked child before ``exec``: only ``open``/``write`` on a
    path computed beforehand, nothing that takes a lock another thread of
    the parent might hold.  None when the node has no cgroup.
    """
    procs = procs_file(node)
    if procs is None:
        return None
    target = str(procs)

    def enter() -> None:
        join(target)

    return enter


def remove_all() -> list[str]:
    """Remove every ``tb-*`` cgroup (moving stray tasks to the root first)."""
    base = _base()
    if base is None:
        return []
    root, version = base
    removed = []
    for path in root.glob(f"{naming.PREFIX}-*"):
        if not path.is_dir():
            continue
        procs = path / ("cgroup.procs" if version == 2 else "tasks")
        try:
            for pid in procs.read_text().split():
                try:
                    (root / ("cgroup.procs" if version == 2 else "tasks")).write_text(pid + "\n")
                except OSError:
                    pass
            os.rmdir(path)
            removed.append(str(path))
        except OSError:
            pass
    return removed
