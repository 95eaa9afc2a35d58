"""A link change (``net set``, a schedule's event) on a network spread over several servers (emulate mode).

Each WAN direction is shaped on exactly one server: the one holding the router it leaves (a tunnelled link's
``a->b`` on ``a``'s server, ``b->a`` on ``b``'s).  A change therefore goes to every server, which applies
what it shapes with the one-machine code (``EmulatedNetwork.change_link``, ``set_link_up`` on its own ends)
and, for a changed delay of a direction shaped elsewhere, resizes its own queues: a queue is sized for the
round trips of the flows through it, and those cross servers (``EmulatedNetwork.note_remote_delay``).

``apply_everywhere`` first asks every server to check the change against its live shapes and backend (nothing
is touched: an invalid change, or a direction no server shapes, is refused with the server named, exit 2),
then applies it on every server at once.  Each server answers ``testbed cluster part-set`` with one JSON line;
the launcher's own part is changed in this process.  A schedule's events were checked on paper before the
trial (``check_schedule``), so they skip the first round, and each server keeps one ``part-set --serve``
(:class:`Agent`) for the trial's length: a one-shot ``part-set`` over ssh took 1.1 s on a loaded stand-in
(the interpreter's start and the network's attach), most of it before the change.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from traffic_control.errors import ValidationError

from .model import Cluster


@dataclass(frozen=True)
class LinkChange:
    """What ``net set`` or one schedule event asks: shape ``changes`` (spec units) on ``directions``, and/or
    link ``link`` taken down or up (``state``)."""

    directions: tuple[tuple[str, str], ...]
    changes: dict[str, Any]
    link: tuple[str, str]
    state: str | None = None  # up | down | None

    def to_dict(self) -> dict[str, Any]:
        return {"directions": [list(d) for d in self.directions], "changes": self.changes, "link": list(self.link),
                "state": self.state}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinkChange:
        return cls(tuple((a, b) for a, b in d["directions"]), dict(d["changes"]), (d["link"][0], d["link"][1]),
                   d.get("state"))

    @classmethod
    def of_event(cls, event: Any) -> LinkChange:
        """A schedule's :class:`traffic_control.schedule.LinkEvent`."""
        return cls(tuple(event.directions()), dict(event.changes), (event.src, event.dst), event.state)


def apply_on_part(net: Any, change: LinkChange, *, check: bool, report: bool = True) -> dict[str, Any]:
    """This server's share of ``change`` on its part ``net`` (an ``EmulatedNetwork``): the directions it
    shapes (``held``), refused with ValidationError when invalid; with ``check`` nothing is touched.
    ``report``: the kernel's view of each changed direction (``links``; ``net set`` prints it)."""
    held = [d for d in change.directions if net.holds(*d)]
    new = {d: net.changed_shape(*d, change.changes) for d in held}
    a, b = change.link
    ends_here = net.holds(a, b) or net.holds(b, a)
    if check:
        return {"held": [list(d) for d in held], "link_end": ends_here}
    for d, shape in new.items():  # every held direction checked before the first is touched
        net.change_link(*d, shape)
    delay = net.spec_changes(change.changes).get("delay_s")
    if delay is not None:
        for d in change.directions:
            if d not in held:
                net.note_remote_delay(*d, float(delay))
    if change.state is not None and ends_here:
        net.set_link_up(a, b, change.state == "up")
    out: dict[str, Any] = {"held": [list(d) for d in held], "link_end": ends_here}
    if report:
        kernel = net.link_report()
        out["links"] = {f"{x}->{y}": kernel[f"{x}->{y}"] for x, y in held}
    return out


def answer(net: Any, req: dict[str, Any]) -> dict[str, Any]:
    """One request (``{"change": ..., "check": bool}``) on this server's part ``net`` (None: no network is up
    here): its answer, ``{"not_up": reason}``, or ``{"invalid": {field, problem, fix}}`` when the change is
    refused here."""
    if net is None:
        return {"not_up": "no testbed network is up on this server"}
    try:
        return apply_on_part(net, LinkChange.from_dict(req["change"]), check=bool(req.get("check")),
                             report=bool(req.get("report", True)))
    except ValidationError as e:
        return {"invalid": {"field": e.field, "problem": e.problem, "fix": e.fix}}


def _attach() -> Any:
    from testbed.network.emulation import EmulatedNetwork, NotUp

    try:
        return EmulatedNetwork.attach(log=lambda m: None)
    except NotUp:
        return None


def part_set(req: dict[str, Any]) -> dict[str, Any]:
    """``testbed cluster part-set``: one request from stdin, one answer."""
    return answer(_attach(), req)


def serve() -> int:
    """``testbed cluster part-set --serve``: attach once, then :func:`serve_requests`."""
    net = _attach()
    return serve_requests(lambda req: answer(net, req))


def serve_requests(handle: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
    """An agent's loop (what :class:`Agent` talks to): print ``ready``, answer one JSON request per stdin line
    (a failure is answered ``{"error": ...}``, the next request still served) until EOF.  Started once per
    trial, so an event costs a round trip, not an ssh login and an interpreter start (~1-5 s on a busy
    server)."""
    import sys

    print("ready", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = handle(json.loads(line))
        except Exception as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out, default=str), flush=True)
    return 0


class Agent:
    """One server's ``part-set --serve`` (or ``shape-set --serve``: ``argv``) over its own ssh connection, for
    a trial's length; ends when :meth:`close` closes its stdin (or the launcher dies)."""

    def __init__(self, remote: Any, argv: tuple[str, ...] = ("cluster", "part-set", "--serve")) -> None:
        from .view import ssh_until_eof

        self.server = remote.server.name
        pipes: list[int] = []
        self.p = ssh_until_eof(remote, list(argv), pipes, owned=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.w = pipes[0]
        self._lock = threading.Lock()
        if (self.p.stdout.readline() if self.p.stdout else "").strip() != "ready":
            self.close()
            raise RuntimeError(f"{self.server}: the link-change agent did not start: {self._stderr()}")

    def _stderr(self) -> str:
        from .launch import tail_of

        try:
            return tail_of(self.p.stderr.read() if self.p.stderr and self.p.poll() is not None else "")
        except (OSError, ValueError):
            return "no message"

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            try:
                os.write(self.w, (json.dumps(req) + "\n").encode())
            except OSError as e:
                raise RuntimeError(f"{self.server}: the link-change agent is gone ({e.strerror})") from None
            line = self.p.stdout.readline() if self.p.stdout else ""
        if not line:
            self.p.wait(timeout=10)
            raise RuntimeError(f"{self.server}: the link-change agent ended (status {self.p.returncode}): "
                               f"{self._stderr()}")
        return json.loads(line)

    def close(self) -> None:
        try:
            os.close(self.w)
        except OSError:
            pass
        try:
            self.p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


@dataclass
class Applied:
    """Every server's answer to one change, and how long each took (s, the ssh round trip included)."""

    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    took_s: dict[str, float] = field(default_factory=dict)

    def holder(self, a: str, b: str) -> tuple[str, dict[str, Any]]:
        """The server that shapes a->b and its kernel report of it."""
        for server, ans in self.answers.items():
            if [a, b] in ans.get("held", []):
                return server, ans.get("links", {}).get(f"{a}->{b}", {})
        raise KeyError(f"{a}->{b}")


def _ask_once(cluster: Cluster, server: str, remote: Any, req: dict[str, Any]) -> dict[str, Any]:
    """One ``part-set`` over ssh (``net set --cluster``)."""
    from .launch import remote_testbed

    cp = remote.run(remote_testbed(cluster.server(server), ["cluster", "part-set"]), input=json.dumps(req),
                    timeout=120)
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{server}: part-set printed no answer: {cp.stderr.strip()[-300:]}")
    return json.loads(lines[-1])


def apply_everywhere(cluster: Cluster, change: LinkChange, *, check_first: bool = True, local: Any = None,
                     agents: dict[str, Agent] | None = None, report: bool = True,
                     log: Callable[[str], None] = lambda m: None) -> Applied:
    """``change`` on every server of ``cluster`` (see the module docstring).  ``local``: the launcher's own part
    (default: the network up on this machine, attached here); ``agents``: each remote server's :class:`Agent`
    (default: one ``part-set`` over ssh per server and round)."""
    from .remote import Remote

    remotes = {s: Remote(cluster.server(s), cluster) for s in cluster.names
               if s != cluster.launcher and not (agents and s in agents)}
    mine = local if local is not None else _attach()

    def ask(server: str, req: dict[str, Any]) -> tuple[dict[str, Any], float]:
        t0 = time.monotonic()
        if server == cluster.launcher:
            out = answer(mine, req)
        elif agents and server in agents:
            out = agents[server].ask(req)
        else:
            out = _ask_once(cluster, server, remotes[server], req)
        if "error" in out:
            raise RuntimeError(out["error"])
        return out, time.monotonic() - t0

    def everywhere(check: bool) -> Applied:
        req = {"change": change.to_dict(), "check": check, "report": report}
        out = Applied()
        errors = []
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(cluster.names)))) as pool:
            futures = {s: pool.submit(ask, s, req) for s in cluster.names}
            for s, fut in futures.items():
                try:
                    out.answers[s], out.took_s[s] = fut.result()
                except Exception as e:
                    errors.append(f"{s}: {e}")
        if errors:
            raise RuntimeError(("the change was NOT applied on every server: " if not check else "")
                               + "; ".join(errors))
        return out

    try:
        if check_first:
            checked = everywhere(True)
            for s, ans in checked.answers.items():
                if "invalid" in ans:
                    bad = ans["invalid"]
                    raise ValidationError(bad["field"] or "net set", f"{s}: {bad['problem']}", bad["fix"])
            for a, b in change.directions:
                if not any([a, b] in ans.get("held", []) for ans in checked.answers.values()):
                    idle = sorted(s for s, ans in checked.answers.items() if "not_up" in ans)
                    raise ValidationError("net set", f"no server shapes {a}->{b}" + (
                        f" (no network is up on {', '.join(idle)})" if idle else ""),
                        "name two adjacent DCs of the topology that is up (`testbed cluster place` shows which "
                        "server holds which)")
        applied = everywhere(False)
        for s, ans in applied.answers.items():
            if "invalid" in ans:
                raise RuntimeError(f"{s} refused the change: {ans['invalid']['problem']}")
        log(f"link change applied on {len(applied.answers)} server(s): "
            + ", ".join(f"{s} {t * 1e3:.0f} ms" for s, t in sorted(applied.took_s.items())))
        return applied
    finally:
        for r in remotes.values():
            r.close()
