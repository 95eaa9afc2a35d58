"""Per-host CPU shares and memory limits through cgroups (v2 where mounted, else v1).

Mininet's CPULimitedHost needs cgroup-tools and cgroup v1; this module writes
the cgroup files directly, works with both hierarchies, and names every group
``tb-<node>`` so that cleanup can find it.

Where the groups live:

* cgroup v2 (one unified tree at ``/sys/fs/cgroup``): ``/sys/fs/cgroup/tb-<node>``;
* cgroup v1 (a tree per controller): ``<controller mount>/<this process's group>/tb-<node>``
  for the ``cpu`` and the ``memory`` controller.  Inside this process's own group,
  not at the tree's root: a machine (or a CI sandbox) that limits the testbed's
  memory keeps limiting what runs in its hosts, and nothing outside is touched.

A limit only binds processes *in* the cgroup, and entering a host's
namespaces (``mnexec -da``, ``ip netns exec``) does not put a process there
(measured: a busy loop started through Mininet's ``popen`` in a host limited
to 0.2 cores used 3.0 CPU-seconds in 3 s).  So every process the testbed
starts in a host joins the host's groups itself, before it execs
(:func:`preexec`), and ``testbed net exec`` does the same.

Memory: ``memory.max`` (v2) / ``memory.limit_in_bytes`` (v1), with swap for
the group capped too where the kernel accounts it, so that a host past its
limit is OOM-killed (and :func:`oom_kills` says so) instead of swapping.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from . import naming

CGROUP_FS = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
#: how deep below a controller's mount the finder looks for ``tb-*`` groups
FIND_DEPTH = 6


def _v2() -> bool:
    return (CGROUP_FS / "cgroup.controllers").exists()


def _v1_mount(controller: str) -> Path | None:
    probe = {"cpu": "cpu.cfs_quota_us", "memory": "memory.limit_in_bytes"}[controller]
    path = CGROUP_FS / controller
    return path if (path / probe).exists() else None


def _own_v1_group(controller: str) -> str:
    """This process's group in the v1 ``controller`` tree ("/" at the root)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                return path or "/"
    except OSError:
        pass
    return "/"


def _parent(controller: str) -> Path | None:
    """Where ``tb-*`` groups for ``controller`` are made; None if the controller is not mounted."""
    if _v2():
        return CGROUP_FS
    mount = _v1_mount(controller)
    if mount is None:
        return None
    return mount / _own_v1_group(controller).lstrip("/")


def _procs_name() -> str:
    return "cgroup.procs" if _v2() else "tasks"


def available(controller: str = "cpu") -> bool:
    if _v2():
        return controller in (CGROUP_FS / "cgroup.controllers").read_text().split()
    return _v1_mount(controller) is not None


def _groups(node: str) -> list[Path]:
    """The node's existing groups (one on v2; one per limited controller on v1).

    Found by walking the trees (well under a millisecond on these machines), so a process
    in another group than the builder's (a later ``net exec`` from another session) finds them.
    """
    name = naming.cgroup_name(node)
    return [p for p in find_all() if p.name == name]


def _make(controller: str, node: str) -> Path:
    parent = _parent(controller)
    if parent is None or not available(controller):
        raise RuntimeError(f"no cgroup {controller} controller mounted (cgroup v2 at {CGROUP_FS} or v1 "
                           f"{CGROUP_FS / controller})")
    if _v2():
        ctl = CGROUP_FS / "cgroup.subtree_control"
        if controller not in ctl.read_text().split():  # enabling it would change the machine: say so instead
            raise RuntimeError(f"the cgroup {controller} controller is not enabled for groups under {CGROUP_FS} "
                               f"(fix: echo +{controller} > {ctl}, or leave {controller} limits out of the topology)")
    path = parent / naming.cgroup_name(node)
    path.mkdir(exist_ok=True)
    return path


def limit(node: str, pid: int, cores: float | None = None, memory_bytes: int | None = None) -> list[str]:
    """Cap ``pid`` (and its future children) at ``cores`` CPUs and ``memory_bytes``; returns the groups."""
    made: list[Path] = []
    if cores is not None:
        path = _make("cpu", node)
        quota = max(1000, int(cores * PERIOD_US))
        if _v2():
            (path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        else:
            (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        made.append(path)
    if memory_bytes is not None:
        path = _make("memory", node)
        if _v2():
            (path / "memory.max").write_text(f"{memory_bytes}\n")
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0\n")
        else:
            (path / "memory.limit_in_bytes").write_text(f"{memory_bytes}\n")
            if (path / "memory.memsw.limit_in_bytes").exists():  # memory + swap: no swapping past the limit
                (path / "memory.memsw.limit_in_bytes").write_text(f"{memory_bytes}\n")
        if path not in made:
            made.append(path)
    for path in made:
        (path / _procs_name()).write_text(f"{pid}\n")
    return [str(p) for p in made]


def procs_files(node: str) -> list[Path]:
    """The files a process writes ``0`` into to join ``node``'s groups (empty if it has none)."""
    return [g / _procs_name() for g in _groups(node) if (g / _procs_name()).exists()]


def join(procs: Path | str | list[Path]) -> None:
    """Move the calling process into the group(s) of ``procs`` (its children follow)."""
    for path in procs if isinstance(procs, list) else [procs]:
        fd = os.open(str(path), os.O_WRONLY)
        try:
            os.write(fd, b"0\n")
        finally:
            os.close(fd)


def preexec(node: str) -> Callable[[], None] | None:
    """A ``preexec_fn`` that puts the new process into ``node``'s groups before it execs.

    Runs in the forked child before ``exec``: only ``open``/``write`` on paths
    computed beforehand, nothing that takes a lock another thread of the
    parent might hold.  None when the node has no group.
    """
    targets = [str(p) for p in procs_files(node)]
    return preexec_into(targets) if targets else None


def preexec_into(targets: list[str], strict: bool = True) -> Callable[[], None]:
    """A ``preexec_fn`` writing the new process into each ``cgroup.procs`` of ``targets`` (paths computed
    beforehand); ``strict=False`` skips a group it cannot enter (a container's, which may be going)."""

    def enter() -> None:
        for target in targets:
            try:
                fd = os.open(target, os.O_WRONLY)
            except OSError:
                if strict:
                    raise
                continue
            try:
                os.write(fd, b"0\n")
            except OSError:
                if strict:
                    raise
            finally:
                os.close(fd)

    return enter


def oom_kills(node: str) -> int:
    """How many processes of ``node`` the kernel's OOM killer ended (its memory limit was hit)."""
    total = 0
    for g in _groups(node):
        for fname in ("memory.events", "memory.oom_control"):  # v2 / v1 (kernel >= 4.13)
            try:
                for line in (g / fname).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        total += int(value)
            except (OSError, ValueError):
                continue
    return total


def memory_peak(node: str) -> int | None:
    """The most memory ``node``'s group has used (bytes), None without a memory group."""
    for g in _groups(node):
        for fname in ("memory.peak", "memory.max_usage_in_bytes"):
            try:
                return int((g / fname).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return None


def find_all() -> list[Path]:
    """Every ``tb-*`` group on the machine, in any tree, wherever an earlier run made it."""
    roots = [CGROUP_FS] if _v2() else [m for m in (_v1_mount("cpu"), _v1_mount("memory")) if m is not None]
    found: list[Path] = []

    def walk(d: Path, depth: int) -> Iterator[Path]:
        try:
            entries = list(os.scandir(d))
        except OSError:
            return
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                continue
            if e.name.startswith(f"{naming.PREFIX}-"):
                yield Path(e.path)
            elif depth < FIND_DEPTH:
                yield from walk(Path(e.path), depth + 1)

    for root in roots:
        for p in walk(root, 0):
            if p not in found:
                found.append(p)
    return found


def remove_all() -> list[str]:
    """Remove every ``tb-*`` group (moving stray tasks to the parent group first)."""
    removed = []
    for path in find_all():
        procs = path / _procs_name()
        try:
            for pid in procs.read_text().split():
                try:
                    (path.parent / _procs_name()).write_text(pid + "\n")
                except OSError:
                    pass
            os.rmdir(path)
            removed.append(str(path))
        except OSError:
            pass
    return removed
