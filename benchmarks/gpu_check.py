"""The GPU check, for the GPU machine a task may be lent (README "GPU check").

That machine has its own Python (3.12) with torch (CUDA) and scientific packages, one GPU, no package
registries and no apt, maybe no network namespaces.  This script uses that machine's torch; the few
pure-Python (and small compiled) wheels it lacks travel in ``.gpu_wheels/`` (``gpu_check.sh
--prepare`` fills it here) and are installed into a temporary directory, never into the system.

It first says what the machine allows, then:
(a) always: the project's trainers on CUDA over loopback (``testbed.training.local``): BSP (gloo all-reduce
    of CUDA tensors), PGCS (the overlap path: a communication thread beside compute), ASP (a parameter
    server); each asserts that every process recorded a CUDA device (name, memory) and that its compute
    spans name it;
(b) where network namespaces, veth, tc and Mininet work: the two-DC emulated experiment
    ``benchmarks/gpu_two_dc.yaml``, its traffic checked on the shaped links (the report's byte table).
One line per check, "not run: why" for what the machine does not allow; results under ``$OUT``.
``--device cpu`` runs (a) on the CPU: the plumbing alone, for a machine without a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".gpu_wheels"
OUT = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu-check-"))
LINES: list[str] = []
FAILED: list[str] = []


def line(name: str, status: str, detail: str) -> None:
    text = f"{name:28} {status:8} {detail}"
    print(text, flush=True)
    LINES.append(text)
    if status == "FAIL":
        FAILED.append(name)


def sh(*argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(list(argv), 127, "", str(e))


def machine() -> dict[str, object]:
    import torch

    info: dict[str, object] = {"python": sys.version.split()[0], "torch": torch.__version__,
                               "cuda": torch.version.cuda, "gpus": torch.cuda.device_count()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update({"gpu": p.name, "memory_gib": round(p.total_memory / 2**30, 1)})
    line("machine", "info", json.dumps(info))
    return info


def dependencies() -> str:
    """Import what the trainers need; install the missing ones from the carried wheels (a temp dir)."""
    need = {"numpy": "numpy", "yaml": "PyYAML", "pydantic": "pydantic", "sklearn": "scikit-learn",
            "psutil": "psutil", "pyroute2": "pyroute2"}
    missing = []
    for mod, dist in need.items():
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(dist)
    if not missing:
        line("dependencies", "ok", "all importable from this machine's Python")
        return ""
    target = Path(tempfile.mkdtemp(prefix="gpu-check-site-"))
    r = sh(sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(WHEELS),
           "--target", str(target), *missing, timeout=300)
    if r.returncode != 0:
        line("dependencies", "FAIL", f"missing {missing}; carried wheels did not install: {r.stderr.strip()[-300:]} "
             "(fix: benchmarks/gpu_check.sh --prepare here, then carry .gpu_wheels)")
        return ""
    sys.path.insert(0, str(target))
    line("dependencies", "ok", f"installed from .gpu_wheels into {target}: {', '.join(missing)}")
    return str(target)


def probes() -> dict[str, tuple[bool, str]]:
    out: dict[str, tuple[bool, str]] = {}
    r = sh("unshare", "-n", "true")
    out["netns"] = (r.returncode == 0, r.stderr.strip()[-120:] or "unshare -n works")
    r = sh("unshare", "-n", "sh", "-c", "ip link add tbv0 type veth peer name tbv1 && ip link del tbv0")
    out["veth"] = (r.returncode == 0, r.stderr.strip()[-120:] or "a veth pair in a new namespace")
    r = sh("unshare", "-n", "sh", "-c", "ip link set lo up && tc qdisc add dev lo root handle 1: htb default 1 "
           "&& tc class add dev lo parent 1: classid 1:1 htb rate 10mbit")
    out["tc htb"] = (r.returncode == 0, r.stderr.strip()[-120:] or "HTB on loopback in a new namespace")
    try:
        importlib.import_module("mininet.net")
        out["mininet"] = (True, "importable")
    except ImportError as e:
        out["mininet"] = (False, f"{e} (Debian's mininet package; no apt here)")
    for k, (ok, why) in out.items():
        line(f"probe {k}", "ok" if ok else "no", why)
    return out


def loopback(label: str, cfg: dict, device: str, dcs: dict[str, int], site: str, backend: str = "gloo") -> None:
    """One trial on 127.0.0.1 with every process on ``device``; the records say where each ran."""
    from testbed.training.local import run_local

    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), site])), OMP_NUM_THREADS="1")
    out = OUT / f"loopback_{label}"
    shutil.rmtree(out, ignore_errors=True)
    res = run_local({**cfg, "device": device}, dcs, out, timeout_s=180, env=env, python=sys.executable)
    if not res.ok:
        line(f"(a) {label}", "FAIL", f"{res.reason}: {res.diagnosis(600)[-600:]}")
        return
    procs = {p.stem: json.loads(p.read_text()) for p in (out / "procs").glob("*.json")}
    wrong = {n: r["device"] for n, r in procs.items() if r["device"]["type"] != device}
    spans = [json.loads(x) for f in (out / "events").glob("*.jsonl") for x in f.read_text().splitlines()]
    compute = [s for s in spans if s.get("phase") == "compute"]
    off = [s for s in compute if s.get("device", "").split(":")[0] != device]
    names = sorted({r["device"].get("name", device) for r in procs.values()})
    if backend == "nccl":  # each rank on its own device, NCCL told to use sockets only
        devs = [r["device"].get("index") for r in procs.values() if r.get("backend") == "nccl"]
        told = [r for r in procs.values() if r.get("nccl_env", {}).get("NCCL_P2P_DISABLE") == "1"]
        if len(devs) < 2 or len(set(devs)) != len(devs) or len(told) != len(devs):
            line(f"(a) {label}", "FAIL", f"nccl ranks on devices {devs}, {len(told)} with the socket-only env")
            return
    if not procs or wrong or not compute or off:
        line(f"(a) {label}", "FAIL", f"processes {len(procs)}, not on {device}: {wrong}; compute spans "
             f"{len(compute)}, {len(off)} elsewhere")
        return
    line(f"(a) {label}", "ok", f"{len(procs)} processes on {device} ({', '.join(names)}), {len(compute)} compute "
         f"spans there, {time.monotonic() - t0:.1f} s")


def emulated(allowed: dict[str, tuple[bool, str]], device: str) -> None:
    lacking = [k for k, (ok, _) in allowed.items() if not ok]
    if lacking:
        line("(b) two-DC emulated run", "not run", f"the machine lacks {', '.join(lacking)}")
        return
    if device != "cuda":
        line("(b) two-DC emulated run", "not run", "--device cpu")
        return
    r = sh(sys.executable, "-m", "testbed.cli", "run", str(REPO / "benchmarks" / "gpu_two_dc.yaml"),
           "--results", str(OUT / "emulated"), timeout=400)
    if r.returncode != 0:
        line("(b) two-DC emulated run", "FAIL", (r.stderr or r.stdout).strip()[-400:])
        return
    line("(b) two-DC emulated run", "ok", r.stdout.strip().splitlines()[-1][:200] if r.stdout.strip() else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where the trainers run (cpu: "
                    "the plumbing alone, on a machine without a GPU)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    info = machine()
    site = dependencies()
    if site:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), site, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(REPO))
    allowed = probes()
    if args.device == "cuda" and not info.get("gpus"):
        line("(a) loopback trainers", "not run", "torch sees no CUDA device (use --device cpu for the plumbing)")
    else:
        digits = {"workload": {"name": "digits", "batch_size": 32}, "stop": {"steps": 20}, "eval_every": 10}
        loopback("bsp (gloo, CUDA tensors)", {**digits, "scheme": {"name": "bsp"}}, args.device,
                 {"a": 1, "b": 1}, site)
        experts = {"workload": {"name": "experts", "experts": 2, "batch_size": 4, "seq_len": 16, "d_model": 16,
                                "n_heads": 2}, "stop": {"steps": 6}, "eval_every": 3}
        loopback("pgcs (overlap path)", {**experts, "scheme": {"name": "pgcs"}}, args.device, {"a": 1, "b": 1},
                 site)
        loopback("asp (parameter server)", {**digits, "scheme": {"name": "asp"}}, args.device, {"a": 1, "b": 1},
                 site)
        if args.device == "cuda" and int(info.get("gpus") or 0) >= 2:
            loopback("bsp (nccl, sockets only)", {**digits, "scheme": {"name": "bsp"}, "backend": "nccl"}, "cuda",
                     {"a": 1, "b": 1}, site, backend="nccl")
        else:
            line("(a) bsp (nccl, sockets only)", "not run", f"NCCL needs one GPU per rank (2 ranks); this machine "
                 f"has {int(info.get('gpus') or 0)}")
    emulated(allowed, args.device)
    line("total", "info", f"{time.monotonic() - t0:.0f} s; results in {OUT}")
    (OUT / "gpu_check.txt").write_text("\n".join(LINES) + "\n")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
