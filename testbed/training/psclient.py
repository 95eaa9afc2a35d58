"""Worker side of the parameter server: push a gradient, get the current model back.

One round trip per update (push-and-pull), as Gsyn's leader does it.  Each
push carries ``seq`` (the client's step); after a broken connection the
client reconnects and sends the same push again, and the server, which
remembers each client's last applied ``seq``, answers without applying it
twice.  Spans: ``push`` (sending the gradient, ``bytes`` = frame bytes),
``wait`` (time the server held the reply for the SSP bound, as the server
reports it), ``pull`` (the rest of the round trip until the model has
arrived; ``bytes_recv``).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

import torch

from testbed.collect.recorder import Recorder
from testbed.training.dist import wan_fields
from testbed.training.wire import recv_msg, send_msg, tune


@dataclass
class Reply:
    version: int
    params: torch.Tensor | None  # float32 view into the client's receive buffer (copy before the next call)
    stop: bool
    header: dict[str, Any]


class PSClient:
    def __init__(self, server_addr: str, server_port: int, client: int, rec: Recorder, *,
                 source_addr: str | None = None, connect_timeout_s: float = 60.0, timeout_s: float = 300.0,
                 name: str = "", retries: int = 3, extra: dict[str, Any] | None = None,
                 wan_dc: str | None = None) -> None:
        self.addr = (server_addr, server_port)
        self.client = client
        self.rec = rec
        self.source = (source_addr, 0) if source_addr else None
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.name = name
        self.retries = retries
        self.extra = extra or {}
        self.wan_dc = wan_dc  # the server's DC when it is another one: pushed bytes cross the WAN to it
        self.sock: socket.socket | None = None
        self._rbuf = bytearray()

    def _connect(self) -> None:
        deadline = time.monotonic() + self.connect_timeout_s
        last: OSError | None = None
        while time.monotonic() < deadline:
            try:
                s = socket.create_connection(self.addr, timeout=min(5.0, self.connect_timeout_s),
                                             source_address=self.source)
                tune(s)
                s.settimeout(self.timeout_s)
                self.sock = s
                return
            except OSError as exc:  # server not up yet: retry
                last = exc
                time.sleep(0.1)
        raise ConnectionError(f"parameter server {self.addr[0]}:{self.addr[1]} unreachable: {last}")

    def _close_sock(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def _roundtrip(self, header: dict[str, Any], payload: Any = None) -> tuple[dict[str, Any], Any, int, int, int]:
        """Send, receive; reconnect and resend on a broken connection. Returns (hdr, view, sent, got, t_sent)."""
        for attempt in range(self.retries + 1):
            try:
                if self.sock is None:
                    self._connect()
                    if header["op"] != "hello":  # re-register before re-sending (idempotent server side)
                        send_msg(self.sock, {"op": "hello", "client": self.client, "resume": True})
                        recv_msg(self.sock, self._rbuf)
                sent = send_msg(self.sock, header, payload)
                t_sent = self.rec.now_ns()
                hdr, view, got = recv_msg(self.sock, self._rbuf)
                if hdr.get("op") == "error":
                    raise RuntimeError(f"parameter server refused {header['op']}: {hdr.get('error')}")
                return hdr, view, sent, got, t_sent
            except (ConnectionError, TimeoutError, OSError):
                self._close_sock()
                if attempt == self.retries:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def _reply(self, hdr: dict[str, Any], view: Any) -> Reply:
        if len(view) > len(self._rbuf):  # recv_msg allocated a new buffer: keep it for next time
            self._rbuf = view.obj
        params = torch.frombuffer(view, dtype=torch.float32) if len(view) else None
        return Reply(int(hdr["version"]), params, bool(hdr.get("stop", False)), hdr)

    def hello(self) -> Reply:
        """Register and get the current model (blocks until the server is reachable)."""
        with self.rec.span("pull", step=None, peer=self.name, what="hello", **self.extra) as sp:
            hdr, view, sent, got, _ = self._roundtrip({"op": "hello", "client": self.client})
            sp.set(bytes=sent, bytes_recv=got, version=hdr.get("version"))
        return self._reply(hdr, view)

    def push(self, step: int, version: int, grad: torch.Tensor, last: bool = False) -> Reply:
        """Push ``grad`` (computed on ``version``) as this client's update ``step``; returns the new model."""
        t0 = self.rec.now_ns()
        header = {"op": "push", "client": self.client, "seq": step, "step": step, "version": version,
                  "last": last}
        hdr, view, sent, got, t_sent = self._roundtrip(header, grad.detach().cpu().numpy())
        t_end = self.rec.now_ns()
        rec, extra = self.rec, self.extra
        wan = wan_fields({self.wan_dc: sent} if self.wan_dc is not None else {})
        rec.emit("push", t0, t_sent - t0, step=step, peer=self.name, bytes=sent, **wan, version=version, **extra)
        wait = min(int(hdr.get("wait_ns", 0)), t_end - t_sent)
        if wait > 0:
            rec.emit("wait", t_sent, wait, step=step, peer=self.name, what="ssp_bound", **extra)
        rec.emit("pull", t_sent + wait, t_end - t_sent - wait, step=step, peer=self.name, bytes_recv=got,
                 version=hdr.get("version"), staleness=hdr.get("staleness"), applied_version=hdr.get("applied"),
                 dup=hdr.get("dup", False), **extra)
        return self._reply(hdr, view)

    def bye(self) -> None:
        try:
            if self.sock is not None:
                send_msg(self.sock, {"op": "bye", "client": self.client})
                recv_msg(self.sock)
        except OSError:
            pass
        finally:
            self._close_sock()
