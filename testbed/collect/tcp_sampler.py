"""Per-connection TCP telemetry from the kernel's socket diagnostics: cwnd, RTT, retransmissions.

A synchronization that took 200 ms too long is a retransmission timeout, a
window that never opened, or a queue that filled; the link samplers show the
link, this sampler shows each connection's view of it.  Every tick it dumps
the established (and closing) IPv4 TCP sockets of each target namespace through
``NETLINK_SOCK_DIAG`` (pyroute2's ``DiagSocket``, ``INET_DIAG_INFO``: the
kernel's ``struct tcp_info``, what ``ss -ti`` prints) and writes one line per
connection that moved data since its last line (``samples/tcp.jsonl``, format
in docs/CONTRACTS.md).

Why it is built this way:

* A netlink socket stays bound to the namespace it was created in, so the
  sampling thread enters each target namespace once (``setns``, which moves
  only the calling thread), creates that namespace's socket and comes back;
  each tick is then one dump per namespace (~3 ms for a few connections),
  with no process started and no namespace switched.
* Idle connections (gloo keeps one per peer pair, most of them quiet) write
  nothing until they move data again: the file holds what changed.
* Loopback connections (a process talking to itself) are left out: they never
  cross an emulated link.
* A connection that moves its last bytes and closes between two ticks would
  leave its final counters unread (a parameter-server client's connection
  closes when its worker ends; under load a tick can come late).  So each
  namespace also has a socket subscribed to the kernel's destroy events
  (``SKNLGRP_INET_TCP_DESTROY``, what ``ss -E`` reads): the kernel sends every
  TCP socket's final ``tcp_info`` as it is freed, and the next tick writes it
  as a ``closed`` line.  Where the subscription is refused the sampler goes
  on without it (``stats()["errors"]`` says so).
* A run cut short (a timeout, a failed worker, Ctrl-C: the trial kills its
  processes) stops the samplers while the killed processes' connections are
  still closing: an orphaned socket drains its send queue and waits for its FIN's
  ACK, a round trip or a queue's worth of the emulated link later.  So the
  ticks dump closing sockets too, and before the final tick the sampler waits
  (at most ``close_grace_s``) until no kept connection is still closing
  (FIN-WAIT-1, CLOSE-WAIT, LAST-ACK, CLOSING); their destroy events then
  arrive in time to become ``closed`` lines.  ``stats()["close_wait_s"]`` says
  how long that took.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .samplers import DEFAULT_RATE_HZ, PeriodicSampler, netns_path

CLONE_NEWNET = 0x40000000
#: ``1 << (INET_DIAG_INFO - 1)``: ask for ``struct tcp_info``.
_INFO_EXT = 1 << (2 - 1)
#: ``tcpi_snd_ssthresh`` before the first loss ("infinite").
_INFINITE_SSTHRESH = 0x7FFFFFFF
_CA_STATES = ("open", "disorder", "cwr", "recovery", "loss")
#: ``enum tcp_states`` (include/net/tcp_states.h; pyroute2's ``SS_*``, not imported here so that the
#: module loads without pyroute2), as socket diagnostics number them
_SS_ESTABLISHED, _SS_FIN_WAIT1, _SS_FIN_WAIT2, _SS_CLOSE_WAIT, _SS_LAST_ACK, _SS_CLOSING = 1, 4, 5, 8, 9, 11
#: what a tick dumps: connections that can still move data, closing ones included
_DUMPED_STATES = sum(1 << s for s in (_SS_ESTABLISHED, _SS_FIN_WAIT1, _SS_FIN_WAIT2, _SS_CLOSE_WAIT,
                                      _SS_LAST_ACK, _SS_CLOSING))
#: what the final tick waits out: states a closing connection leaves within round trips once its process is
#: gone (FIN-WAIT-2 waits for the peer's close and TIME-WAIT sockets carry no counters)
_CLOSING_MASK = sum(1 << s for s in (_SS_FIN_WAIT1, _SS_CLOSE_WAIT, _SS_LAST_ACK, _SS_CLOSING))
#: the most the final tick waits for closing connections (a 4 MB send queue drains in 3.4 s at 10 Mbit/s)
DEFAULT_CLOSE_GRACE_S = 5.0


@dataclass(frozen=True)
class TcpTarget:
    """A namespace whose connections are sampled, and the node name its lines carry.

    ``addresses`` and ``skip_ports`` narrow a namespace the trainers share with other traffic (shape mode:
    a server's own namespace also holds its ssh sessions): only connections with both ends in
    ``addresses`` (empty: any) and neither port in ``skip_ports`` are kept."""

    node: str
    netns: str | int | None  # name, /proc/<pid>/ns/net path, pid, or None (this process's own)
    addresses: frozenset[str] = frozenset()
    skip_ports: frozenset[int] = frozenset()

    def keeps(self, msg: Any) -> bool:
        """Whether a socket-diag message is one of this target's connections."""
        if self.addresses and not {str(msg.get("idiag_src")), str(msg.get("idiag_dst"))} <= self.addresses:
            return False
        return not ({msg.get("idiag_sport"), msg.get("idiag_dport")} & self.skip_ports)


#: ``NETLINK_SOCK_DIAG`` and its multicast group of destroyed TCP sockets (``SKNLGRP_INET_TCP_DESTROY``).
_NETLINK_SOCK_DIAG = 4
_DESTROY_GROUP_MASK = 1 << (1 - 1)


def _dump_socket() -> Any:
    """A bound pyroute2 ``DiagSocket`` (dumps) in this thread's namespace."""
    from pyroute2.netlink.diag import DiagSocket

    sock = DiagSocket()
    sock.bind()
    return sock


def _destroy_listener() -> socket.socket:
    """A non-blocking netlink socket in this thread's namespace that receives every freed TCP socket's info."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG)
    try:
        sock.bind((0, _DESTROY_GROUP_MASK))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def closed_messages(sock: socket.socket) -> list[Any]:
    """Drain ``sock`` (a :func:`_destroy_listener`): the decoded ``inet_diag_msg`` of each socket freed since."""
    from pyroute2.netlink.diag import inet_diag_msg

    out = []
    while True:
        try:
            data = sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return out
        off = 0
        while off + 16 <= len(data):
            msg = inet_diag_msg(data[off:])
            msg.decode()
            length = msg["header"]["length"]
            if length <= 0:
                break
            out.append(msg)
            off += (length + 3) & ~3


def _diag_socket_in(ns_path: str | None, make: Callable[[], Any] = _dump_socket) -> Any:
    """``make()`` run with this thread in the namespace at ``ns_path`` (its own when None): a socket bound there."""
    if ns_path is None:
        return make()
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(ns_path, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns_path}: {os.strerror(err)}")
        try:
            sock = make()
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:  # never leave the thread in a node's namespace
                raise OSError(ctypes.get_errno(), "setns back into the sampler's own namespace failed")
        return sock
    finally:
        os.close(target)
        os.close(own)


def connection_row(msg: Any) -> dict[str, Any] | None:
    """One socket-diag message as a record (without ``ts`` and ``node``); None for loopback or no info."""
    src, dst = msg.get("idiag_src"), msg.get("idiag_dst")
    info = msg.get_attr("INET_DIAG_INFO")
    if info is None or str(src).startswith("127.") or str(dst).startswith("127."):
        return None
    ssthresh = info.get("tcpi_snd_ssthresh")
    ca = info.get("tcpi_ca_state")
    return {
        "src": f"{src}:{msg.get('idiag_sport')}",
        "dst": f"{dst}:{msg.get('idiag_dport')}",
        "cwnd": info.get("tcpi_snd_cwnd"),
        "ssthresh": None if ssthresh in (None, _INFINITE_SSTHRESH) else ssthresh,
        "rtt_us": info.get("tcpi_rtt"),
        "rttvar_us": info.get("tcpi_rttvar"),
        "min_rtt_us": info.get("tcpi_min_rtt"),
        "retrans_total": info.get("tcpi_total_retrans"),
        "lost": info.get("tcpi_lost"),
        "unacked": info.get("tcpi_unacked"),
        "bytes_acked": info.get("tcpi_bytes_acked"),
        "bytes_received": info.get("tcpi_bytes_received"),
        "delivery_rate_bps": None if info.get("tcpi_delivery_rate") is None else 8 * info["tcpi_delivery_rate"],
        "mss": info.get("tcpi_snd_mss"),
        "ca_state": _CA_STATES[ca] if isinstance(ca, int) and 0 <= ca < len(_CA_STATES) else ca,
    }


class TcpSampler(PeriodicSampler):
    """Samples every established IPv4 TCP connection of the target namespaces (see the module docstring)."""

    name = "tcp"

    def __init__(self, out_path: str | os.PathLike[str], targets: Iterable[TcpTarget],
                 t0_ns: int | None = None, rate_hz: float = DEFAULT_RATE_HZ, *,
                 offset_ns: int | None = None, close_grace_s: float = DEFAULT_CLOSE_GRACE_S) -> None:
        super().__init__(out_path, t0_ns, rate_hz, offset_ns=offset_ns)
        self.targets = list(targets)
        self.close_grace_s = float(close_grace_s)
        self._close_wait_s = 0.0
        self._socks: dict[str, Any] = {}
        self._closing: dict[str, socket.socket] = {}
        self._last: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._by_node: dict[str, TcpTarget] = {}

    def _open(self) -> None:
        for t in self.targets:
            self._socks[t.node] = _diag_socket_in(netns_path(t.netns))
            try:
                self._closing[t.node] = _diag_socket_in(netns_path(t.netns), _destroy_listener)
            except OSError as exc:  # an old kernel or no CAP_NET_ADMIN: ticks only
                self._error(f"{t.node}: no destroy events ({exc}); a connection closed between ticks "
                            "keeps the counters of its last tick")
        self._by_node = {t.node: t for t in self.targets}

    def _close(self) -> None:
        for s in [*self._socks.values(), *self._closing.values()]:
            with contextlib.suppress(Exception):
                s.close()
        self._socks.clear()
        self._closing.clear()

    def _closed_rows(self, node: str, ts_ns: int) -> list[dict[str, Any]]:
        """The final line of each of ``node``'s connections freed since the last tick."""
        out: list[dict[str, Any]] = []
        sock = self._closing.get(node)
        if sock is None:
            return out
        target = self._by_node[node]
        for msg in closed_messages(sock):
            if msg.get("idiag_family") != socket.AF_INET or not msg.get("idiag_dport") or not target.keeps(msg):
                continue  # a listener (no peer) or another family
            row = connection_row(msg)
            if row is None:
                continue
            self._last.pop((node, row["src"], row["dst"]), None)
            out.append({"ts": ts_ns, "node": node, **row, "closed": True})
        return out

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "close_wait_s": round(self._close_wait_s, 3)}

    def _kept(self, node: str, msgs: Iterable[Any]) -> list[Any]:
        target = self._by_node[node]
        return [m for m in msgs if target.keeps(m)]

    def _still_closing(self) -> int:
        """How many kept connections are in a state they leave within round trips (:data:`_CLOSING_MASK`)."""
        n = 0
        for node, sock in self._socks.items():
            try:
                msgs = sock.get_sock_stats(family=socket.AF_INET, states=_CLOSING_MASK, extensions=_INFO_EXT)
            except Exception:  # noqa: S112 - a node that went away has nothing left to close
                continue
            n += sum(1 for m in self._kept(node, msgs) if connection_row(m) is not None)
        return n

    def _before_final_tick(self) -> None:
        """Wait (at most ``close_grace_s``) for connections still closing, so their destroy events are read."""
        t0 = time.monotonic()
        while (closing := self._still_closing()) and time.monotonic() - t0 < self.close_grace_s:
            time.sleep(0.02)
        self._close_wait_s = time.monotonic() - t0
        if closing:
            self._error(f"connections still closing after {self.close_grace_s:g} s: their last line is the "
                        "final tick's, not a closed line")

    def _sample(self, ts_ns: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for node, sock in self._socks.items():
            try:
                out.extend(self._closed_rows(node, ts_ns))
            except OSError as exc:
                self._error(f"{node}: destroy events: {type(exc).__name__}: {exc}")
            try:
                msgs = sock.get_sock_stats(family=socket.AF_INET, states=_DUMPED_STATES, extensions=_INFO_EXT)
            except Exception as exc:  # a node that went away: said once per tick, others still sampled
                self._error(f"{node}: {type(exc).__name__}: {exc}")
                continue
            for msg in self._kept(node, msgs):
                row = connection_row(msg)
                if row is None:
                    continue
                key = (node, row["src"], row["dst"])
                moved = (row["bytes_acked"], row["bytes_received"], row["retrans_total"])
                if self._last.get(key) == moved:
                    continue
                self._last[key] = moved
                out.append({"ts": ts_ns, "node": node, **row})
        return out
