"""GPUs per trainer host (``gpus:`` in a topology): which devices each host gets, and how it gets them.

A count is assigned from the machine's devices in plan order, without overlap;
indices are taken as given.  Two hosts on one device, or more hosts' GPUs
than the machine has, is an error unless the topology says ``gpu_sharing:
true``.  A process host gets ``CUDA_VISIBLE_DEVICES`` (its trainers see only
its devices, numbered from 0); a container host a Docker device request
(``--gpus device=...``, the NVIDIA runtime).  Once any DC names ``gpus``,
hosts without them see no GPU, so no process silently takes GPU 0.  Each
trainer records the device it used (``training.runtime.process_record``).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from traffic_control.errors import ValidationError


def machine_gpus() -> list[dict[str, Any]]:
    """The machine's NVIDIA GPUs as ``nvidia-smi`` lists them (index, name, memory in MiB); empty without."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        r = subprocess.run([smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            out.append({"index": int(parts[0]), "name": parts[1], "memory_mib": parts[2]})
    return out


def wanted(topo: Any) -> bool:
    return any(dc.gpus not in (None, 0) for dc in topo.dcs)


def assign(topo: Any, hosts: list[tuple[str, str]], available: int) -> dict[str, tuple[int, ...]]:
    """Devices per host (``hosts``: (node, dc) of every trainer host, in plan order); ``{}`` when no DC
    asks for GPUs.  Raises :class:`ValidationError` naming ``dcs[DC].gpus`` and the fix."""
    if not wanted(topo):
        return {}
    sharing = topo.gpu_sharing
    first = {dc.name: i for i, dc in enumerate(topo.dcs)}
    out: dict[str, tuple[int, ...]] = {}
    owner: dict[int, str] = {}

    def field(dc: str) -> str:
        return f"dcs[{first[dc]}].gpus"

    if available == 0:
        dc = next(d.name for d in topo.dcs if d.gpus not in (None, 0))
        raise ValidationError(field(dc), "this machine has no GPU (nvidia-smi lists none)",
                              "remove gpus: (trainers then use the CPU), or run on a machine with NVIDIA GPUs "
                              "and their driver")
    # explicit indices first (they are what the user asked for), then counts from what is left
    for node, dc_name in hosts:
        g = topo.dc(dc_name).gpus
        if not isinstance(g, tuple):
            continue
        bad = [i for i in g if i >= available]
        if bad:
            raise ValidationError(field(dc_name), f"device {bad[0]} does not exist: this machine has {available} "
                                  f"GPU(s), 0-{available - 1}", f"use indices below {available}, or a count")
        for i in g:
            if i in owner and not sharing:
                raise ValidationError(field(dc_name), f"GPU {i} given to both {owner[i]} and {node}",
                                      "give each host its own devices, or set gpu_sharing: true")
            owner.setdefault(i, node)
        out[node] = g
    free = [i for i in range(available) if i not in owner]
    nxt = 0
    for node, dc_name in hosts:
        g = topo.dc(dc_name).gpus
        if not isinstance(g, int) or g == 0:
            continue
        if g > available:
            raise ValidationError(field(dc_name), f"{g} GPUs per host, but this machine has {available}",
                                  f"at most gpus: {available}")
        if len(free) - nxt >= g:
            out[node] = tuple(free[nxt:nxt + g])
            nxt += g
        elif sharing:  # round robin over every device
            start = sum(len(v) for v in out.values())
            out[node] = tuple((start + k) % available for k in range(g))
        else:
            need = sum(topo.dc(d).gpus for _, d in hosts if isinstance(topo.dc(d).gpus, int))
            raise ValidationError(field(dc_name), f"the hosts ask for {need} GPUs in all (with the indices given: "
                                  f"{len(owner)} taken), this machine has {available}",
                                  "fewer hosts or GPUs per host, or gpu_sharing: true")
    return out


def check_nccl(topo: Any, workers: list[tuple[str, str]], field: str) -> None:
    """``backend: nccl`` can run on this topology: every worker host has GPUs of its own.

    NCCL needs one device per rank (two ranks on one device fail in NCCL's
    set-up), so every DC holding workers must name ``gpus`` and the hosts may
    not share them; :func:`assign` then refuses more GPUs than the machine has.
    Raises :class:`ValidationError` naming ``field`` (the backend) and the fix.
    """
    missing = sorted({dc for _, dc in workers if topo.dc(dc).gpus in (None, 0)})
    if missing:
        raise ValidationError(field, f"nccl needs one GPU per worker, but DC(s) {', '.join(missing)} give their "
                              "hosts no gpus", "give every trainer DC gpus: 1 (or device indices), or backend: gloo")
    if topo.gpu_sharing:
        raise ValidationError(field, "nccl needs one GPU per worker, but gpu_sharing: true lets workers share one",
                              "remove gpu_sharing (each host its own device), or backend: gloo")


def visible_devices(devices: tuple[int, ...] | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a host: its devices, or none at all ("")."""
    return ",".join(str(i) for i in devices or ())


def docker_request(devices: tuple[int, ...]) -> list[str]:
    """``docker run`` options giving a container exactly these devices (NVIDIA runtime)."""
    return ["--gpus", f'"device={",".join(str(i) for i in devices)}"']


def check_docker_gpus() -> None:
    """Docker can hand out GPUs: its daemon knows the NVIDIA runtime (else DockerError with the fix)."""
    from .docker_hosts import DockerError, _docker

    r = _docker("info", "--format", "{{json .Runtimes}}", check=False, timeout=20)
    if "nvidia" not in r.stdout:
        raise DockerError("gpus: on runtime: docker hosts needs Docker's NVIDIA runtime, which this daemon lacks "
                          f"(runtimes: {r.stdout.strip()[:200]}) (fix: install nvidia-container-toolkit and run "
                          "`nvidia-ctk runtime configure --runtime=docker`, then restart dockerd)")
