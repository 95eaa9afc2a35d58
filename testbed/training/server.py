"""Parameter server for ``asp``, ``ssp`` and ``gsyn``: ``python -m testbed.training.server JOB.json``.

One process owns the model and the optimizer.  Clients (a worker for
asp/ssp, a group leader for gsyn) push a gradient tagged with the model
version it was computed on; the server applies it *at once* as one
optimizer step (version += 1) and replies with its current model.  It
records, per update, ``staleness = version at apply - version computed on``.

Exactly once: a push carries ``seq`` (the client's step); the server keeps
each client's last applied ``seq`` and answers a repeated push (a client
re-sending after a broken connection) with the current model, without
applying it again (``dup: true`` in the reply and in the ``apply`` span).

SSP (Petuum clock semantics): a client's clock is the number of its pushes
applied; after applying a push that brings a client to clock ``c``, its reply
(and so its next step) is held until ``min(clocks of clients still
training) >= c - s`` - no worker starts a step more than ``s`` clocks ahead
of the slowest.  ``s = 0`` is BSP's barrier.  ASP and Gsyn never hold.

Transport: framed TCP (see ``wire`` for why), one thread per client
connection; the model update is serialised by one lock.  The server binds
its job's address so traffic crosses the emulated interface.  It
evaluates snapshots on the trial's cadence (``evaluator.EvalCadence``: samples
processed, an update being one worker's batch for asp/ssp and a group's for
gsyn, or every ``eval_every`` updates) in a background thread (``metrics.csv``), stops clients when the wall-clock limit or the target
is reached, and exits 0 once every client has said goodbye (1 if a client
vanished without it).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from testbed.collect.recorder import Recorder
from testbed.training.dist import wan_fields
from testbed.training.evaluator import EvalCadence, Evaluator
from testbed.training.flat import FlatModel, make_optimizer
from testbed.training.jobs import Job
from testbed.training.wire import recv_msg, send_msg, tune


class ParameterServer:
    def __init__(self, job: Job, rec: Recorder, device: torch.device | str = "cpu",
                 evaluate: bool = True) -> None:
        from testbed.training.workloads import build_workload

        tc = job.training
        self.job, self.rec, self.tc = job, rec, tc
        self.workload = build_workload(tc.workload.name, tc.workload.params, tc.seed)
        self.flat = FlatModel(self.workload.build_model(), device)
        self.opt = make_optimizer(tc.optimizer, self.flat.plist)
        if tc.scheme.name == "gsyn":
            groups = job.groups or []
            self.clients = list(range(len(groups)))
            self.client_name = {g: job.peers[m[0]].host for g, m in enumerate(groups)}
            self.client_dc = {g: job.peers[m[0]].dc for g, m in enumerate(groups)}
        else:
            self.clients = list(range(job.world_size))
            self.client_name = {r: job.peers[r].host for r in self.clients}
            self.client_dc = {r: job.peers[r].dc for r in self.clients}
        self.dc = job.dc
        self.cadence = EvalCadence(tc)
        # training.compute.pad_gradient: pushes arrive as the worker's whole gradient buffer (n values,
        # a control slot, zeros up to the profiled model's size) and pulls go out padded the same way
        from testbed.training.compute import Accelerator

        self.msg_pad = Accelerator(job.compute, 0).pad_floats(self.flat.n, control=1)
        from testbed.training.lr import resolve_job

        # the lr rule and the evaluation cadence count the same thing: the samples one update averages
        self.lr_res = resolve_job(job)
        self.samples = 0  # training samples in the applied updates (a group's batches for gsyn)
        self.staleness_bound: int | None = tc.scheme.params.staleness if tc.scheme.name == "ssp" else None
        self.version = 0
        self.clock = dict.fromkeys(self.clients, 0)
        self.last_seq = dict.fromkeys(self.clients, -1)
        self.done: set[int] = set()
        self.lost: set[int] = set()
        self.stop = False
        self.applied = 0
        self.cv = threading.Condition()
        self.evaluator = None
        if evaluate:
            self.evaluator = Evaluator(self.workload, rec, Path(job.out_dir) / "metrics.csv", tc.stop.target, device,
                                           give_up=tc.stop.give_up)
            self.evaluator.submit(0, 0, self.flat.params, wall_s=0.0, samples=0)
        self.sock: socket.socket | None = None
        self.started = threading.Event()

    # -- state changes (under self.cv) ------------------------------------------
    def _apply(self, client: int, hdr: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        seq, step, base = int(hdr["seq"]), int(hdr["step"]), int(hdr["version"])
        name = self.client_name.get(client, str(client))
        t0 = self.rec.now_ns()
        with self.cv:
            if seq <= self.last_seq[client]:
                self.rec.emit("apply", t0, self.rec.now_ns() - t0, step=step, peer=name, client=client,
                              version=base, dup=True, bytes_recv=payload.nbytes)
                return {"dup": True, "staleness": None, "applied": None}
            grad = torch.frombuffer(payload, dtype=torch.float32)
            if grad.numel() not in (self.flat.n, self.flat.n + 1 + self.msg_pad):
                raise ValueError(f"client {client} pushed {grad.numel()} values, model has {self.flat.n}")
            grad = grad[: self.flat.n]
            staleness = self.version - base
            self.flat.grads.copy_(grad)
            lr = self._update_lr(client, staleness)
            for pg in self.opt.param_groups:
                pg["lr"] = lr
            self.opt.step()
            self.version += 1
            self.applied += 1
            self.last_seq[client] = seq
            self.clock[client] = step + 1
            if hdr.get("last"):
                self.done.add(client)
            version = self.version
            self.samples += self.lr_res.batch_for(client if isinstance(self.lr_res.effective_batch, list) else None)
            if self.evaluator is not None and self.cadence.due(version, self.samples):
                self.evaluator.submit(version, version, self.flat.params, samples=self.samples)
            self._check_stop()
            self.cv.notify_all()
        extra = {"group": client} if self.tc.scheme.name == "gsyn" else {}
        self.rec.emit("apply", t0, self.rec.now_ns() - t0, step=step, peer=name, client=client, version=base,
                      applied_version=version, staleness=staleness, bytes_recv=payload.nbytes, lr=lr, **extra)
        return {"dup": False, "staleness": staleness, "applied": version}

    def _update_lr(self, client: int, staleness: int) -> float:
        """This update's lr: the scheme's rule for ``client`` (Gsyn: its group's size), divided by
        ``max(1, staleness)`` when ``staleness_aware`` (``testbed.training.lr``)."""
        from testbed.training.lr import staleness_lr

        res = self.lr_res
        lr = res.for_client(client if isinstance(res.lr, list) else None)
        return staleness_lr(lr, staleness) if res.staleness_aware else lr

    def _check_stop(self) -> None:
        if self.stop:
            return
        wall = self.tc.stop.wall_s
        if (wall is not None and self.started.is_set() and self.rec.train_s() >= wall) or (
            self.evaluator is not None and self.evaluator.done.is_set()
        ):
            self.stop = True
            self.cv.notify_all()

    def _min_clock(self) -> int:
        active = [self.clock[c] for c in self.clients if c not in self.done]
        return min(active) if active else 1 << 62

    def _gate(self, client: int, step: int) -> tuple[int, int | None]:
        """SSP: hold until this client may start clock ``step + 1``; returns (ns waited, min clock then)."""
        s = self.staleness_bound
        with self.cv:
            if s is None or client in self.done:  # a finished client starts no further clock
                return 0, None
        need = step + 1 - s
        t0 = self.rec.now_ns()
        with self.cv:
            while client not in self.done and not self.stop and self._min_clock() < need:
                self.cv.wait(0.5)
                self._check_stop()
            low = self._min_clock()
        waited = self.rec.now_ns() - t0
        if waited > 1_000_000:
            self.rec.emit("wait", t0, waited, step=step, peer=self.client_name.get(client), client=client,
                          what="ssp_bound")
        return waited, (low if low < 1 << 62 else None)

    def _snapshot(self) -> tuple[int, bool, torch.Tensor]:
        with self.cv:
            return self.version, self.stop, self.flat.snapshot()

    # -- connections ------------------------------------------------------------
    def _send_model(self, conn: socket.socket, step: int | None, client: int, extra: dict[str, Any]) -> None:
        version, stop, params = self._snapshot()
        if self.msg_pad:  # the profiled model's size on the wire (training.compute.pad_gradient)
            params = torch.cat([params, torch.zeros(1 + self.msg_pad, dtype=params.dtype)])
        t0 = self.rec.now_ns()
        sent = send_msg(conn, {"op": "model", "version": version, "stop": stop, **extra}, params.numpy())
        more = {"min_clock": extra["min_clock"]} if extra.get("min_clock") is not None else {}
        dc = self.client_dc.get(client)
        wan = wan_fields({dc: sent} if dc not in (None, self.dc) else {})
        self.rec.emit("pull", t0, self.rec.now_ns() - t0, step=step, peer=self.client_name.get(client),
                      client=client, bytes=sent, **wan, version=version, **more)

    def _serve(self, conn: socket.socket) -> None:
        client: int | None = None
        buf = bytearray()
        try:
            while True:
                hdr, payload, _ = recv_msg(conn, buf)
                if len(payload) > len(buf):
                    buf = payload.obj  # type: ignore[assignment]
                op = hdr.get("op")
                client = int(hdr["client"])
                if client not in self.clock:
                    send_msg(conn, {"op": "error", "error": f"unknown client {client}"})
                    return
                if op == "hello":
                    with self.cv:
                        self.lost.discard(client)
                    self._send_model(conn, None, client, {})
                elif op == "push":
                    info = self._apply(client, hdr, payload)
                    waited, low = self._gate(client, int(hdr["step"]))
                    self._send_model(conn, int(hdr["step"]), client, {**info, "wait_ns": waited, "min_clock": low})
                elif op == "bye":
                    with self.cv:
                        self.done.add(client)
                        self.cv.notify_all()
                    send_msg(conn, {"op": "ok", "version": self.version})
                    return
                else:
                    send_msg(conn, {"op": "error", "error": f"unknown op {op!r}"})
                    return
        except (ConnectionError, OSError):
            if client is not None:
                with self.cv:
                    if client not in self.done:
                        self.lost.add(client)
                    self.cv.notify_all()
        finally:
            conn.close()

    def serve(self, ready: threading.Event | None = None, bye_grace_s: float = 5.0,
              barrier: Any | None = None) -> int:
        """Accept clients until all said goodbye; returns the exit status.

        ``barrier`` (the trial's start barrier, a callable) runs on its own
        thread once the server listens: the workers pull their first model
        (``hello``) before they arrive there, so the accept loop must already
        run.  Without one (in-process tests) the training clock is t0.
        """
        self.sock = socket.create_server((self.job.address, self.job.server_port or 0), backlog=64, reuse_port=False)
        self.sock.settimeout(0.2)
        if ready is not None:
            ready.set()
        self.error: BaseException | None = None
        if barrier is None:
            self.started.set()
        else:
            threading.Thread(target=self._meet, args=(barrier,), name="start-barrier", daemon=True).start()
        threads: list[threading.Thread] = []
        lost_since: float | None = None
        try:
            while True:
                if self.error is not None:
                    raise self.error
                with self.cv:
                    self._check_stop()
                    finished = self.done | self.lost
                    all_gone = finished >= set(self.clients)
                    if all_gone and not self.lost:
                        break
                    if all_gone:
                        lost_since = lost_since or time.monotonic()
                        if time.monotonic() - lost_since > bye_grace_s:
                            break
                    else:
                        lost_since = None
                try:
                    conn, _ = self.sock.accept()
                except TimeoutError:
                    continue
                tune(conn)
                conn.settimeout(None)
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True, name="ps-conn")
                t.start()
                threads.append(t)
        finally:
            self.sock.close()
        for t in threads:
            t.join(timeout=2)
        return 1 if self.lost else 0

    def _meet(self, barrier: Any) -> None:
        try:
            barrier()
            self.started.set()
        except BaseException as exc:  # noqa: BLE001 - handed to the serving loop, which re-raises it
            self.error = exc

    def finish(self) -> None:
        if self.evaluator is not None:
            self.evaluator.final(self.version, self.version, self.flat.params, samples=self.samples)
            self.evaluator.close()
        if self.tc.save_model:
            from testbed.training.runtime import save_model

            save_model(self.job, self.flat.params)


def main(argv: list[str] | None = None) -> int:
    from testbed.training.runtime import make_recorder, setup_process

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m testbed.training.server JOB.json", file=sys.stderr)
        return 2
    from testbed.training.start import meet, store_for

    job = Job.read(argv[0])
    device = setup_process(job)
    rec = make_recorder(job, device)
    try:
        server = ParameterServer(job, rec, device)
        rc = server.serve(barrier=lambda: meet(job, store_for(job), rec))
        server.finish()
        with rec.span("wait", what="server_exit", applied=server.applied, version=server.version):
            pass
        return rc
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        rec.close()


if __name__ == "__main__":
    sys.exit(main())
