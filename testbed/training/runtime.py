"""What every training process sets up, and the compute step all schemes share.

* process setup: ``GLOO_SOCKET_IFNAME`` from the job's interface (so gloo's
  traffic uses the emulated interface; with ``backend: nccl`` also NCCL's
  socket-only environment, ``training.dist.nccl_env``), torch threads (default 1: the
  hosts share few cores and timings must mean something), seeds, device
  (``auto`` = CUDA when available), SIGTERM -> ``SystemExit`` so records are
  flushed when the supervisor stops a process;
* the slowdown model (a fixed factor and/or random extra delay, slept after
  the real compute, inside the ``compute`` span);
* :class:`WorkerContext.compute`: one forward/backward on this worker's
  shard, padded (synthetic), brought up to the emulated accelerator's profiled
  time (``training.compute``, :mod:`testbed.training.compute`) and slowed
  down, recorded as a ``compute`` span; :meth:`WorkerContext.finish_compute`
  is that tail, shared with PGCS's own compute loop.  The first call first
  meets every process of the trial at the start barrier (:mod:`.start`), so
  each scheme's own set-up (world, subgroups, first pull) comes before the
  training clock's zero, and a plug-in scheme gets the barrier without
  calling it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from testbed.collect.recorder import Recorder, anchored_offset, events_path
from testbed.training.compute import Accelerator, draw_delay
from testbed.training.flat import FlatModel
from testbed.training.jobs import Job, process_record_path
from testbed.training.workloads import build_workload


def setup_process(job: Job) -> torch.device:
    """Capabilities, environment, threads, seeds and device for this process; returns the device."""
    from testbed.training.privileges import apply_from_env

    caps = apply_from_env()  # a container host's trainer: no capability from here on
    if job.ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = job.ifname
    nccl = job.role == "worker" and job.training.backend == "nccl"
    if nccl:
        from testbed.training.dist import nccl_env

        os.environ.update(nccl_env(job.ifname, job.host))
    torch.set_num_threads(job.training.threads)
    seed = job.training.seed * 1000 + job.rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    signal.signal(signal.SIGTERM, _sigterm)
    device = resolve_device(job.training.device)
    if nccl:
        if device.type != "cuda":
            raise RuntimeError(f"backend: nccl needs a CUDA device, but {job.host} has none that torch sees "
                               "(give its DC gpus:, or use backend: gloo)")
        # an emulated host's first device (gpus: gives it its own, CUDA_VISIBLE_DEVICES / --gpus); without
        # an assignment (loopback runs) rank r takes device r mod count, so ranks do not share one
        assigned = os.environ.get("CUDA_VISIBLE_DEVICES") is not None
        device = torch.device("cuda", 0 if assigned else job.rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    write_process_record(job, device, caps)
    return device


def process_record(device: torch.device) -> dict[str, Any]:
    """What this process ran on: its interpreter and torch (the image's, in a container host), its mount
    namespace (a container host's, which the manifest's ``runtimes`` name) and the device it actually used (a CUDA device's index, name and memory).  Written once per process
    (:func:`write_process_record`); the trial puts it in the manifest."""
    import platform

    out: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable,
                           "torch": torch.__version__, "torch_path": str(Path(torch.__file__).parent),
                           "mnt_ns": os.readlink("/proc/self/ns/mnt"), "device": {"type": device.type}}
    from .jobs import TORCHRUN_ENV

    launch = {k: os.environ[k] for k in TORCHRUN_ENV if k in os.environ}
    if launch:  # what it was told at launch (trainers across servers get torchrun's variables)
        out["launch_env"] = launch
    if "CUDA_VISIBLE_DEVICES" in os.environ:  # the devices its host was given (gpus:), whatever torch then used
        out["cuda_visible_devices"] = os.environ["CUDA_VISIBLE_DEVICES"]
    nccl = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    if nccl:  # what NCCL was told (backend: nccl), so a reader can see every byte was kept on sockets
        out["nccl_env"] = dict(sorted(nccl.items()))
        if device.type == "cuda":
            try:
                v = torch.cuda.nccl.version()  # (major, minor, patch); an int in older torch
                out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
            except (AttributeError, RuntimeError):  # a torch built without NCCL
                out["nccl_version"] = None
    if device.type == "cuda":
        i = torch.cuda.current_device() if device.index is None else device.index
        props = torch.cuda.get_device_properties(i)
        out["device"].update({"index": i, "name": props.name, "memory_bytes": int(props.total_memory),
                              "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    return out


def write_process_record(job: Job, device: torch.device, capabilities: dict[str, str] | None = None) -> None:
    path = process_record_path(job.out_dir, job.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = process_record(device)
    if capabilities is not None:  # dropped (testbed.training.privileges): the sets after, as /proc says
        rec["capabilities"] = capabilities
    if job.role == "worker":
        rec["backend"] = job.training.backend
    path.write_text(json.dumps(rec) + "\n")  # one complete line: a remote server's record streams home whole


def _sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def resolve_device(pref: str) -> torch.device:
    if pref == "cuda" or (pref == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device: cuda asked for, but torch sees no CUDA device")
        return torch.device("cuda")
    return torch.device("cpu")


def make_recorder(job: Job, device: torch.device | None = None) -> Recorder:
    """The process's span writer; every span names the scheme and, when given, the device that ran it."""
    static = {"scheme": job.training.scheme.name, **({"device": str(device)} if device is not None else {})}
    return Recorder(events_path(job.out_dir, job.host, job.role, job.rank), host=job.host, dc=job.dc,
                    rank=job.rank, role=job.role, t0_ns=job.t0_ns, static=static,
                    offset_ns=anchored_offset(job.clock))


class Slowdown:
    """Extra compute time: ``(factor - 1) * measured`` plus draws from the job's delay distributions."""

    def __init__(self, factor: float, delays: list[Any], seed: int) -> None:
        self.factor = factor
        self.delays = delays
        self.rng = np.random.default_rng(seed)

    def extra_s(self, measured_s: float) -> float:
        extra = (self.factor - 1.0) * measured_s
        for d in self.delays:
            if d.prob < 1.0 and self.rng.random() >= d.prob:
                continue
            extra += self._draw(d)
        return max(0.0, extra)

    def _draw(self, d: Any) -> float:
        return draw_delay(d, self.rng)


@dataclass
class ComputeLeft:
    """A step's set compute still to spend: ``pad_s`` the workload's own way (the synthetic workload's
    ``busy`` mode spins), ``sleep_s`` asleep (the emulated accelerator and the slowdown model);
    ``fields`` go into the step's compute span.  ``spend(fraction)`` spends that part of both, so a
    schedule can spend it in pieces (DDP-style overlap: some before backward, the rest during it)."""

    wl: Any
    pad_s: float
    sleep_s: float
    fields: dict[str, Any]

    def spend(self, fraction: float = 1.0) -> None:
        self.wl.spend(self.pad_s * fraction)
        if self.sleep_s * fraction > 0:
            time.sleep(self.sleep_s * fraction)


class WorkerContext:
    """One worker's model, data, recorder and stop rules; schemes drive it."""

    def __init__(self, job: Job, *, grad_extra: int = 1, param_extra: int = 2) -> None:
        self.job = job
        self.device = setup_process(job)
        self.rec = make_recorder(job, self.device)
        tc = job.training
        # buffers handed to collectives: the model's own (CPU, or CUDA under NCCL) or pinned CPU copies
        self.comm_on_device = self.device.type == "cpu" or tc.backend == "nccl"
        self.workload = build_workload(tc.workload.name, tc.workload.params, tc.seed)
        model = self.workload.build_model()
        # emulated accelerator; with pad_gradient, zero slots after the control slots make every
        # gradient message (grads_out) exactly the profiled model's gradient bytes
        self.accel = Accelerator(job.compute, tc.seed * 7919 + job.rank)
        self.pad = self.accel.pad_floats(sum(p.numel() for p in model.parameters()), control=grad_extra)
        self.flat = FlatModel(model, self.device, extra=max(grad_extra, param_extra) + self.pad)
        self.slowdown = Slowdown(job.slowdown_factor, job.slowdown_delays, tc.seed * 7919 + job.rank)
        self.deadline_s = tc.stop.wall_s
        self.max_steps = tc.stop.steps
        self.last_loss: float | None = None
        self.started = False

    # -- the training clock ---------------------------------------------------------
    def start(self) -> None:
        """Meet every process of the trial at the start barrier (once); the training clock starts there."""
        if self.started:
            return
        from testbed.training.start import meet, store_for

        meet(self.job, store_for(self.job), self.rec)
        self.started = True

    def train_s(self) -> float:
        """Seconds since the start barrier released (the clock of metrics and of ``stop.wall_s``)."""
        return self.rec.train_s()

    # -- stop rules -------------------------------------------------------------
    def steps_done(self, step: int) -> bool:
        """True when ``step`` (0-based) is past the step budget."""
        return self.max_steps is not None and step >= self.max_steps

    def wall_exceeded(self) -> bool:
        return self.deadline_s is not None and self.rec.train_s() >= self.deadline_s

    def is_last(self, step: int) -> bool:
        """Whether the step about to finish is this worker's last by its own rules."""
        return self.steps_done(step + 1) or self.wall_exceeded()

    # -- the compute step ---------------------------------------------------------
    def compute(self, step: int, shard: int, num_shards: int, **extra: Any) -> float:
        """Gradient of this shard's batch at ``step`` into ``flat.grads``; returns the batch loss."""
        wl, flat = self.workload, self.flat
        self.start()
        self._maybe_fail(step)
        with self.rec.span("compute", step=step, **extra) as sp:
            t = time.perf_counter()
            batch = tuple(x.to(self.device, non_blocking=True) for x in wl.batch(step, shard, num_shards))
            flat.zero_grad()
            value = wl.backward(flat.model, batch)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            sp.set(loss=round(value, 6), **self.finish_compute(wl, t))
        self.last_loss = value
        return value

    def finish_compute(self, wl: Any, t0: float, ahead_s: float = 0.0) -> dict[str, Any]:
        """The tail of every compute span, after the real forward/backward that began at
        ``perf_counter() == t0`` (``ahead_s``: compute still to come, counted as spent): the
        synthetic workload's pad, the emulated accelerator's sleep up to its profiled time,
        then the slowdown model on top.  Returns the span fields that say what was done."""
        left = self.plan_compute(wl, time.perf_counter() - t0 + ahead_s)
        left.spend()
        return left.fields

    def plan_compute(self, wl: Any, elapsed_s: float) -> ComputeLeft:
        """What :meth:`finish_compute` spends after ``elapsed_s`` of real compute, spending nothing yet
        (one draw of the accelerator's and the slowdown model's times)."""
        pad_s = wl.pad_left_s(elapsed_s)
        accel_s, fields = self.accel.plan(elapsed_s, elapsed_s + pad_s)
        extra_s = self.slowdown.extra_s(elapsed_s + pad_s + accel_s)
        return ComputeLeft(wl, pad_s, accel_s + extra_s, {"slowdown_s": round(extra_s, 6), **fields})

    def _maybe_fail(self, step: int) -> None:
        f = self.job.training.fault
        if f is None or step != f.step:
            return
        if (f.host is not None and f.host != self.job.host) or (f.rank is not None and f.rank != self.job.rank):
            return
        if f.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if f.mode == "stop":
            self.rec.flush()
            os.kill(os.getpid(), signal.SIGSTOP)
        if f.mode == "oom":
            self.rec.flush()
            hog = []
            for _ in range(64 * 16):  # 64 MiB at a time, every page written so that it is really used
                hog.append(bytearray(b"\1" * (64 << 20)))
            raise RuntimeError(f"injected fault: {self.job.host} allocated {len(hog) * 64} MiB without being stopped")
        raise RuntimeError(f"injected fault: {self.job.host} (rank {self.job.rank}) crashes at step {step}")

    # -- views for communication (zero-copy on CPU and under NCCL, staged CPU copies for gloo on CUDA) --
    def grads_out(self) -> torch.Tensor:
        """Gradients plus one control slot (plus ``pad`` zeros) as a tensor the backend sends (CPU for
        gloo; the CUDA buffer itself under NCCL, which the parameter server's TCP copies out)."""
        n = self.flat.n + 1 + self.pad
        if self.comm_on_device:
            return self.flat.grad_buf[:n]
        if not hasattr(self, "_cgrad"):
            self._cgrad = torch.zeros(n, pin_memory=True)
        self._cgrad.copy_(self.flat.grad_buf[:n])
        return self._cgrad

    def grads_in(self, t: torch.Tensor) -> None:
        if t.data_ptr() != self.flat.grad_buf.data_ptr():
            self.flat.grad_buf[: t.numel()].copy_(t)

    def params_out(self) -> torch.Tensor:
        """Parameters plus two control slots (version, stop) (plus ``pad`` zeros) as a CPU tensor."""
        n = self.flat.n + 2 + self.pad
        if self.comm_on_device:
            return self.flat.buf[:n]
        if not hasattr(self, "_cparam"):
            self._cparam = torch.zeros(n, pin_memory=True)
        self._cparam.copy_(self.flat.buf[:n])
        return self._cparam

    def params_in(self, t: torch.Tensor) -> None:
        if t.data_ptr() != self.flat.buf.data_ptr():
            self.flat.buf[: t.numel()].copy_(t)

    def close(self) -> None:
        self.rec.close()


def save_model(job: Job, params: torch.Tensor) -> None:
    """``models/<role>.<rank>.pt``: the final flat parameters (tests and offline checks)."""
    from pathlib import Path

    d = Path(job.out_dir) / "models"
    d.mkdir(parents=True, exist_ok=True)
    torch.save(params.detach().cpu().clone(), d / f"{job.role}.{job.rank}.pt")
