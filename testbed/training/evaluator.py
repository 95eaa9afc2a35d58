"""Held-out evaluation off the training path, written to ``metrics.csv``.

The evaluating process (BSP rank 0, or the parameter server) hands a CPU
snapshot of the parameters to a background thread and goes on training;
the thread evaluates the snapshots in the order they were taken and writes
a row ``step,wall_s,loss,acc,expert,updates,samples`` per snapshot
(``wall_s`` = seconds on the training clock - since the trial's start
barrier - *of the snapshot*, not of the evaluation; ``samples`` = training
samples all workers had processed into that model) and an ``eval`` span,
and sets :attr:`reached` when the stop target is met, :attr:`gave_up` when
the ``stop.give_up`` rule judges the trial hopeless (either sets :attr:`done`,
which the schemes poll to stop).

No snapshot is dropped silently: they queue up (every scheme is evaluated
on the same cadence, see ``TrainingConfig.eval_every_samples``, and a
curve with holes where the evaluator was busy would favour the schemes
that update slowly).  Only past :data:`MAX_BACKLOG` pending snapshots is
the oldest dropped, and then counted: the ``eval`` spans carry
``dropped``, and :meth:`SnapshotEvaluator.close` prints a warning.
Evaluation still costs CPU on that host; the ``eval`` spans show how much.
"""

from __future__ import annotations

import csv
import math
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any

import torch

from testbed.collect.recorder import Recorder

COLUMNS = ("step", "wall_s", "loss", "acc", "expert", "updates", "samples")

#: Pending snapshots kept before the oldest is dropped (and counted): memory stays bounded.
MAX_BACKLOG = 256


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
              updates: int, expert: int | None = None, samples: int | None = None) -> None:
        row = {"step": step, "wall_s": round(wall_s, 6), "loss": loss, "acc": acc, "expert": expert,
               "updates": updates, "samples": samples}
        self.rows.append(row)
        self._w.writerow(["" if row[c] is None else row[c] for c in COLUMNS])
        self._fh.flush()

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


class EvalCadence:
    """When the evaluating process takes a snapshot: one rule, whatever the scheme's update is.

    With ``training.eval_every_samples = E`` a snapshot is due whenever the
    training samples processed by all workers together cross a multiple of
    E: the same cadence for a BSP step (N x batch samples), an ASP update
    (one worker's batch) and a Gsyn update (a group's batches).  Without it
    (the default, kept for old specs) every ``eval_every`` model updates,
    which differs per scheme in samples; the report says which ran.
    """

    def __init__(self, training: Any) -> None:
        self.every_samples: int | None = getattr(training, "eval_every_samples", None)
        self.every_updates = int(training.eval_every)
        self._bucket = 0

    def due(self, updates: int, samples: int, *, crossing: bool = False) -> bool:
        """Whether the model after ``updates`` updates and ``samples`` samples gets a snapshot.

        ``crossing``: ``updates`` may jump by more than one between calls (DiLoCo counts inner
        steps but has a new model only every H of them): due when it crossed a multiple of
        ``eval_every`` since the last snapshot, not only when it lands on one.
        """
        if self.every_samples is None and not crossing:
            return updates % self.every_updates == 0
        count, every = (samples, self.every_samples) if self.every_samples is not None \
            else (updates, self.every_updates)
        bucket = count // every
        if bucket > self._bucket:
            self._bucket = bucket
            return True
        return False

    def describe(self) -> str:
        if self.every_samples is None:
            return f"every {self.every_updates} model updates"
        return f"every {self.every_samples} training samples (all workers)"


def meets(target: Any | None, res: dict[str, Any]) -> bool:
    """Whether one evaluation result reaches the stop target (acc >= value, loss <= value)."""
    if target is None:
        return False
    v = res.get(target.metric)
    return v is not None and (v >= target.value if target.metric == "acc" else v <= target.value)


def gives_up(rule: Any | None, res: dict[str, Any], wall_s: float) -> bool:
    """Whether one evaluation (of a snapshot taken ``wall_s`` into training) makes the trial give up.

    ``rule`` is ``stop.give_up`` (:class:`testbed.training.config.GiveUpConfig`): a non-finite loss
    gives up at any time; from ``after_s`` on, a metric worse than ``value`` does (loss > value,
    acc < value).  The lr search calls this on ``metrics.csv`` rows to say which trial gave up
    where, so it is the one definition."""
    if rule is None:
        return False
    loss = res.get("loss")
    if loss is not None and not math.isfinite(float(loss)):
        return True
    if wall_s < rule.after_s:
        return False
    v = res.get(rule.metric)
    if v is None:
        return False
    v = float(v)
    if not math.isfinite(v):
        return True
    return v > rule.value if rule.metric == "loss" else v < rule.value


class SnapshotEvaluator:
    """The machinery both evaluators share: a queue of snapshots, one background thread.

    ``_put(key, ...)`` appends a snapshot; the thread runs ``_evaluate(key,
    *job)`` for each in submission order.  Subclasses build the models and
    write rows.
    """

    def __init__(self, rec: Recorder, metrics_path: str | Path, target: Any | None, name: str,
                 give_up: Any | None = None) -> None:
        self.rec = rec
        self.target = target
        self.give_up = give_up
        self.writer = MetricsWriter(metrics_path)
        self.reached = threading.Event()
        self.gave_up = threading.Event()
        self.done = threading.Event()  # reached or gave_up: the training loops poll this to stop
        self._cv = threading.Condition()
        self._pending: deque[tuple[int, tuple[int, int, float, int | None, torch.Tensor]]] = deque()
        self.dropped = 0
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _put(self, key: int, step: int, updates: int, params: torch.Tensor, wall_s: float | None = None,
             samples: int | None = None) -> None:
        snap = params.detach().to("cpu", copy=True)
        with self._cv:
            if len(self._pending) >= MAX_BACKLOG:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append((key, (step, updates, self.rec.train_s() if wall_s is None else wall_s,
                                        samples, snap)))
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
        if self.dropped:
            print(f"warning: the evaluator fell {MAX_BACKLOG} snapshots behind and dropped {self.dropped} "
                  f"(the oldest pending); metrics.csv has holes there", file=sys.stderr)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if not self._pending:
                    return
                key, job = self._pending.popleft()
                self._busy = True
            try:
                self._evaluate(key, *job)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _evaluate(self, key: int, step: int, updates: int, wall_s: float, samples: int | None,
                  snap: torch.Tensor) -> None:
        raise NotImplementedError

    def _judge(self, results: list[dict[str, Any]], complete: bool) -> bool:
        """Set :attr:`reached` / :attr:`gave_up` (and :attr:`done`) from each model's latest result
        (a dict with ``wall_s``); True on give-up.

        ``complete``: every model has a result (the target needs all of them; one hopeless
        model is enough to give up)."""
        if complete and results and all(meets(self.target, r) for r in results):
            self.reached.set()
            self.done.set()
        elif not self.reached.is_set() and any(gives_up(self.give_up, r, r["wall_s"]) for r in results):
            self.gave_up.set()
            self.done.set()
            return True
        return False


class Evaluator(SnapshotEvaluator):
    """One model (BSP rank 0, the parameter server)."""

    def __init__(self, workload: Any, rec: Recorder, metrics_path: str | Path,
                 target: Any | None = None, device: torch.device | str = "cpu", give_up: Any | None = None) -> None:
        from testbed.training.flat import FlatModel

        self.workload = workload
        self.flat = FlatModel(workload.build_model(), device)
        self.flat.model.eval()
        self.last: dict[str, Any] | None = None
        super().__init__(rec, metrics_path, target, "evaluator", give_up)

    def submit(self, step: int, updates: int, params: torch.Tensor, wall_s: float | None = None,
               samples: int | None = None) -> None:
        """Queue a snapshot (the caller's tensor is copied); ``wall_s`` defaults to the training clock now."""
        self._put(0, step, updates, params, wall_s, samples)

    def final(self, step: int, updates: int, params: torch.Tensor, samples: int | None = None) -> dict[str, Any]:
        """Evaluate synchronously (after the pending ones) unless this exact update was evaluated."""
        self.drain()
        if self.last is not None and self.last["updates"] == updates:
            return self.last
        self.submit(step, updates, params, samples=samples)
        self.drain()
        assert self.last is not None
        return self.last

    def _evaluate(self, key: int, step: int, updates: int, wall_s: float, samples: int | None,
                  snap: torch.Tensor) -> None:
        with self.rec.span("eval", step=step, updates=updates, backlog=len(self._pending),
                           dropped=self.dropped) as sp:
            self.flat.load(snap.to(self.flat.device))
            res = self.workload.evaluate(self.flat.model)
            sp.set(loss=res.get("loss"), acc=res.get("acc"))
            self.last = {"step": step, "updates": updates, "wall_s": wall_s, "samples": samples, **res}
            if self._judge([self.last], True):
                sp.set(gave_up=True)
        self.writer.write(step, wall_s, res.get("loss"), res.get("acc"), updates, samples=samples)
