"""Held-out evaluation off the training path, written to ``metrics.csv``.

The evaluating process (BSP rank 0, or the parameter server) hands a CPU
snapshot of the parameters to a background thread and goes on training;
the thread evaluates the newest snapshot (older pending ones are dropped,
never queued up), writes a row ``step,wall_s,loss,acc,expert,updates``
(``wall_s`` = seconds since t0 *of the snapshot*, not of the evaluation)
and an ``eval`` span, and sets :attr:`reached` when the stop target is met.
Evaluation still costs CPU on that host; the ``eval`` spans show how much.
"""

from __future__ import annotations

import csv
import threading
from pathlib import Path
from typing import Any

import torch

from testbed.collect.recorder import Recorder

COLUMNS = ("step", "wall_s", "loss", "acc", "expert", "updates")


class MetricsWriter:
    """Appends rows to ``metrics.csv`` and flushes each one (a crash keeps the curve)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "w", newline="", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._w = csv.writer(self._fh)
        self._w.writerow(COLUMNS)
        self._fh.flush()
        self.rows: list[dict[str, Any]] = []

    def write(self, step: int, wall_s: float, loss: float | None, acc: float | None,
              updates: int, expert: int | None = None) -> None:
        row = {"step": step, "wall_s": round(wall_s, 6), "loss": loss, "acc": acc, "expert": expert,
               "updates": updates}
        self.rows.append(row)
        self._w.writerow(["" if row[c] is None else row[c] for c in COLUMNS])
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def meets(target: Any | None, res: dict[str, Any]) -> bool:
    """Whether one evaluation result reaches the stop target (acc >= value, loss <= value)."""
    if target is None:
        return False
    v = res.get(target.metric)
    return v is not None and (v >= target.value if target.metric == "acc" else v <= target.value)


class SnapshotEvaluator:
    """The machinery both evaluators share: newest snapshot per key, one background thread.

    ``_put(key, job)`` replaces the pending job of ``key`` (older ones are
    dropped, never queued up); the thread runs ``_evaluate(key, *job)`` for
    the pending keys in key order.  Subclasses build the models and write rows.
    """

    def __init__(self, rec: Recorder, metrics_path: str | Path, target: Any | None, name: str) -> None:
        self.rec = rec
        self.target = target
        self.writer = MetricsWriter(metrics_path)
        self.reached = threading.Event()
        self._cv = threading.Condition()
        self._pending: dict[int, tuple[int, int, float, torch.Tensor]] = {}
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _put(self, key: int, step: int, updates: int, params: torch.Tensor, wall_s: float | None = None) -> None:
        snap = params.detach().to("cpu", copy=True)
        with self._cv:
            self._pending[key] = (step, updates, self.rec.wall_s() if wall_s is None else wall_s, snap)
            self._cv.notify_all()

    def drain(self) -> None:
        with self._cv:
            while self._pending or self._busy:
                self._cv.wait(0.05)

    def close(self) -> None:
        self.drain()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=5)
        self.writer.close()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                key = min(self._pending)
                job = self._pending.pop(key)
                self._busy = True
            try:
                self._evaluate(key, *job)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _evaluate(self, key: int, step: int, updates: int, wall_s: float, snap: torch.Tensor) -> None:
        raise NotImplementedError


class Evaluator(SnapshotEvaluator):
    """One model (BSP rank 0, the parameter server)."""

    def __init__(self, workload: Any, rec: Recorder, metrics_path: str | Path,
                 target: Any | None = None, device: torch.device | str = "cpu") -> None:
        from testbed.training.flat import FlatModel

        self.workload = workload
        self.flat = FlatModel(workload.build_model(), device)
        self.flat.model.eval()
        self.last: dict[str, Any] | None = None
        super().__init__(rec, metrics_path, target, "evaluator")

    def submit(self, step: int, updates: int, params: torch.Tensor, wall_s: float | None = None) -> None:
        """Queue a snapshot (the caller's tensor is copied)."""
        self._put(0, step, updates, params, wall_s)

    def final(self, step: int, updates: int, params: torch.Tensor) -> dict[str, Any]:
        """Evaluate synchronously (after the pending one) unless this exact update was evaluated."""
        self.drain()
        if self.last is not None and self.last["updates"] == updates:
            return self.last
        self.submit(step, updates, params)
        self.drain()
        assert self.last is not None
        return self.last

    def _evaluate(self, key: int, step: int, updates: int, wall_s: float, snap: torch.Tensor) -> None:
        with self.rec.span("eval", step=step, updates=updates) as sp:
            self.flat.load(snap.to(self.flat.device))
            res = self.workload.evaluate(self.flat.model)
            sp.set(loss=res.get("loss"), acc=res.get("acc"))
        self.writer.write(step, wall_s, res.get("loss"), res.get("acc"), updates)
        self.last = {"step": step, "updates": updates, "wall_s": wall_s, **res}
        if meets(self.target, res):
            self.reached.set()
