"""Controller side: start, attach to, change, watch and stop one daemon per shaped interface.

The daemon runs inside the router's network namespace, entered with
``nsenter --net=...`` (which execs, so the child's pid is the daemon's).  The
two sides share a state directory: ``shape.json`` (controller -> daemon, then
SIGHUP), ``health.json`` (daemon -> controller, rewritten every 100 ms) and
``stop`` (controller -> daemon: the next SIGTERM is an orderly stop).

A daemon started with ``detach=True`` runs in its own session and outlives
the process that started it (the network it shapes stays up after ``testbed
net up`` returns); any later process controls it with :meth:`attach` on its
state directory.

Death is seen two ways, both well within a second: the child's exit status
(immediate when we are its parent), or its pid gone from ``/proc`` (when we
attached), and the heartbeat's age (a hung or stopped daemon).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ValidationError
from . import rules
from .daemon import HEALTH_FILE, SHAPE_FILE, STOP_FILE, write_json_atomic
from .shape import ImpairmentShape

#: A heartbeat older than this means the daemon is hung.  A *dead* daemon is
#: seen at once (its exit status); a hang needs a silent heartbeat, and on a
#: saturated 2-core machine every process can be descheduled for a while:
#: during a 6-worker training run beside a QEMU VM all six daemons were seen
#: 0.61 s behind at once, so 0.5 s gave false alarms.  3 s keeps hangs
#: detected quickly without failing healthy runs.
STALE_AFTER_S = 3.0
_IFNAME = re.compile(r"[^\s/:'\"]{1,15}")
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

Netns = str | int | None


def netns_prefix(netns: Netns) -> list[str]:
    """Argument prefix that runs a command in ``netns``.

    ``None``: the current namespace; an ``int``: the namespace of that pid (a
    Mininet host's shell); a path: that namespace file; a name: ``ip netns``'s
    ``/run/netns/NAME``.
    """
    if netns is None:
        return []
    if isinstance(netns, int):
        path = f"/proc/{netns}/ns/net"
    elif "/" in netns:
        path = netns
    else:
        path = f"/run/netns/{netns}"
    return ["nsenter", f"--net={path}", "--"]


def check_ifname(ifname: str) -> None:
    """Reject names Linux would refuse or that would confuse the rule marker (``:``)."""
    if not _IFNAME.fullmatch(ifname) or len(ifname.encode()) > 15:
        raise ValidationError("ifname", f"invalid interface name {ifname!r}",
                              "1-15 characters, no whitespace, '/' or ':'")


@dataclass(frozen=True)
class Health:
    """What :meth:`UserspaceImpairment.health` saw."""

    alive: bool
    state: str
    reason: str = ""
    age_s: float | None = None
    generation: int = -1
    stats: dict[str, Any] = field(default_factory=dict)


class DaemonError(RuntimeError):
    """The daemon failed to start or to apply a change (message has its stderr/error)."""


class UserspaceImpairment:
    """One impaired interface: a daemon holding its egress packets for delay/jitter/loss.

    Use :meth:`start`; then :meth:`change`, :meth:`health`, :meth:`stop`.
    """

    def __init__(self, netns: Netns, ifname: str, state_dir: Path, proc: subprocess.Popen[bytes] | None,
                 shape: ImpairmentShape, own_state_dir: bool, *, pid: int | None = None,
                 generation: int = 0) -> None:
        self.netns = netns
        self.ifname = ifname
        self.state_dir = state_dir
        self.proc = proc
        self._pid = proc.pid if proc is not None else pid
        self.shape = shape
        self.generation = generation
        self._own_state_dir = own_state_dir
        self._stopped = False
        self._log = state_dir / "daemon.log"

    # ----------------------------------------------------------------- start
    @classmethod
    def start(cls, netns: Netns, ifname: str, shape: ImpairmentShape | Any, queue_num: int | None = None,
              *, state_dir: str | os.PathLike[str] | None = None, mechanism: str = "netlink",
              python: str | None = None, ready_timeout_s: float = 10.0, detach: bool = False, env: dict[str, str] | None = None,
              extra_args: Sequence[str] = ()) -> UserspaceImpairment:
        """Start the daemon for ``ifname`` in ``netns``; returns once its rules are in place.

        ``shape``: an :class:`ImpairmentShape` or anything with the same
        attribute names (``from_any``).  ``queue_num``: the NFQUEUE number,
        unique per namespace; default the interface's ifindex (unique there
        by construction).  ``detach``: the daemon gets its own session and lives on after this
        process exits (control it later with :meth:`attach`); otherwise it
        stops, orderly, when this process goes away.  Raises
        :class:`DaemonError` with the daemon's output if it is not running
        within ``ready_timeout_s``.
        """
        shape = ImpairmentShape.from_any(shape)
        check_ifname(ifname)
        own = state_dir is None
        sdir = Path(tempfile.mkdtemp(prefix=f"tc-userspace-{ifname}-")) if own else Path(state_dir)
        sdir.mkdir(parents=True, exist_ok=True)
        for stale in (HEALTH_FILE, STOP_FILE):
            (sdir / stale).unlink(missing_ok=True)
        write_json_atomic(sdir / SHAPE_FILE, {"generation": 0, "shape": shape.to_dict()})
        argv = [*netns_prefix(netns), python or sys.executable, "-m", "traffic_control.userspace", "run",
                "--ifname", ifname, "--state-dir", str(sdir), "--mechanism", mechanism, *extra_args]
        if not detach:
            argv += ["--parent-pid", str(os.getpid())]
        if queue_num is not None:
            argv += ["--queue", str(queue_num)]
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        with open(sdir / "daemon.log", "wb") as log:
            # A detached daemon gets its own session: a Ctrl-C meant for the command that
            # started it (its terminal's process group) must not end the network's impairment.
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    env=env, close_fds=True, start_new_session=detach)
        imp = cls(netns, ifname, sdir, proc, shape, own)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            data = imp._read_health()
            if data and data.get("state") == "running":
                return imp
            if proc.poll() is not None or (data and data.get("state") == "failed"):
                break
            time.sleep(0.02)
        detail = imp._log_tail()
        # Only end the process: the rules for this interface may belong to a
        # daemon that is already running there (a refused second start); a
        # daemon that fails during its own start-up removes what it installed.
        imp._stopped = True
        (sdir / STOP_FILE).touch()  # if it got as far as its rules, it removes them on the way out
        imp._terminate(1.0)
        if own:
            shutil.rmtree(sdir, ignore_errors=True)
        raise DaemonError(f"userspace impairment on {ifname} did not start: {detail}")

    @classmethod
    def attach(cls, state_dir: str | os.PathLike[str], netns: Netns = None) -> UserspaceImpairment:
        """Control a daemon another process started (``detach=True``) through its state directory.

        Works whether the daemon is alive or not (:meth:`health` says which);
        raises :class:`DaemonError` if the directory holds no daemon's state.
        """
        sdir = Path(state_dir)
        try:
            generation, shape = _read_shape(sdir)
            data = json.loads((sdir / HEALTH_FILE).read_text())
        except (OSError, ValueError, KeyError) as exc:
            raise DaemonError(f"no userspace impairment state in {sdir}: {exc}") from None
        return cls(netns, str(data["ifname"]), sdir, None, shape, False, pid=int(data["pid"]),
                   generation=generation)

    # ----------------------------------------------------------------- change
    def change(self, shape: ImpairmentShape | Any, timeout_s: float = 2.0) -> None:
        """Apply ``shape`` to packets arriving from now on; returns once the daemon has it."""
        shape = ImpairmentShape.from_any(shape)
        # Another controller may have changed it meanwhile: continue from the file's generation.
        try:
            self.generation = max(self.generation, _read_shape(self.state_dir)[0])
        except (OSError, ValueError, KeyError):
            pass
        self.generation += 1
        write_json_atomic(self.state_dir / SHAPE_FILE, {"generation": self.generation, "shape": shape.to_dict()})
        if not self._signal(signal.SIGHUP):
            raise DaemonError(f"change on {self.ifname} impossible: {self.health().reason}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data = self._read_health()
            if data and data.get("generation") == self.generation:
                self.shape = shape
                return
            if data and data.get("error"):
                raise DaemonError(f"change on {self.ifname} failed: {data['error']}")
            if self._exit_status() is not None:
                break
            time.sleep(0.01)
        raise DaemonError(f"change on {self.ifname} not applied within {timeout_s} s: {self.health().reason}")

    # ----------------------------------------------------------------- health
    @property
    def pid(self) -> int:
        assert self._pid is not None
        return self._pid

    def _exit_status(self) -> int | str | None:
        """None while the daemon runs; its exit status (our child), or "gone" (attached)."""
        if self.proc is not None:
            return self.proc.poll()
        return None if _pid_is_daemon(self.pid, self.state_dir) else "gone"

    def _signal(self, sig: int) -> bool:
        """Send ``sig`` to the daemon; False if it is not running."""
        if self._exit_status() is not None:
            return False
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _read_health(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.state_dir / HEALTH_FILE).read_text())
        except (OSError, ValueError):
            return None

    def _log_tail(self, limit: int = 2000) -> str:
        try:
            return self._log.read_text(errors="replace")[-limit:].strip() or "(no output)"
        except OSError:
            return "(no log)"

    def health(self) -> Health:
        """Alive, or why not: exited (with status), failed (with error), or heartbeat stale."""
        data = self._read_health() or {}
        age = time.time() - data["time"] if "time" in data else None
        state = data.get("state", "unknown")
        gen = data.get("generation", -1)
        stats = data.get("stats", {})
        code = self._exit_status()
        if code is not None:
            how = f"exited with status {code}" if code != "gone" else "process gone"
            return Health(False, "dead", f"{how}: {self._log_tail(300)}", age, gen, stats)
        if state in ("failed", "terminated"):
            return Health(False, "failed", str(data.get("error")), age, gen, stats)
        if age is None or age > STALE_AFTER_S:
            return Health(False, "stale", f"no heartbeat for {age if age is None else round(age, 3)} s", age, gen, stats)
        return Health(state == "running", state, "", age, gen, stats)

    # ----------------------------------------------------------------- stop
    def stop(self, timeout_s: float = 3.0) -> None:
        """Orderly stop: held packets released, the daemon ends, this interface's rules removed.

        Idempotent.  Rules are removed even if the daemon already died, which
        ends the fail-closed state: call it when the run is over.
        """
        if self._stopped:
            return
        self._stopped = True
        try:
            (self.state_dir / STOP_FILE).touch()
        except OSError:
            pass
        self._terminate(timeout_s)
        cleanup(self.netns, self.ifname)
        if self._own_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def _terminate(self, timeout_s: float) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            return
        if not self._signal(signal.SIGTERM):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._exit_status() is not None:
                return
            time.sleep(0.02)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read_shape(state_dir: Path) -> tuple[int, ImpairmentShape]:
    data = json.loads((state_dir / SHAPE_FILE).read_text())
    return int(data["generation"]), ImpairmentShape.from_dict(data["shape"])


def _pid_is_daemon(pid: int, state_dir: Path) -> bool:
    """True while ``pid`` is a live (not zombie) daemon of ``state_dir`` (guards against pid reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return str(state_dir).encode() in cmdline


def cleanup(netns: Netns = None, ifname: str | None = None) -> int:
    """Remove every rule this backend installed in ``netns`` (or for one interface there).

    Works from the kernel's rule set alone (comment marker), so it is safe
    after any crash; returns the number of rules removed.
    """
    return rules.remove(netns_prefix(netns), ifname)


class Watchdog:
    """Polls impairments in a thread and calls ``on_death(imp, health)`` once per death.

    For the network builder: mark the run as soon as a link loses its
    impairment (its traffic is then dropped: fail closed).
    """

    def __init__(self, impairments: Iterable[UserspaceImpairment],
                 on_death: Callable[[UserspaceImpairment, Health], None], interval_s: float = 0.2) -> None:
        self.impairments = list(impairments)
        self.on_death = on_death
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._reported: set[int] = set()
        self._thread = threading.Thread(target=self._run, name="tc-userspace-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def add(self, imp: UserspaceImpairment) -> None:
        """Watch one more impairment (e.g. one started when a link first got a delay)."""
        self.impairments = [*self.impairments, imp]

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for imp in self.impairments:
                if imp._stopped or id(imp) in self._reported:
                    continue
                health = imp.health()
                if not health.alive:
                    self._reported.add(id(imp))
                    self.on_death(imp, health)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
