"""Run a whole training trial on loopback: every process a subprocess on 127.0.0.1.

Used by the tests and for developing schemes without Mininet.  Hosts are
named ``<dc><i>`` (``a1, a2, b1, ...``), the parameter server ``ps`` (in
``ps_dc``, default the first DC); ports are picked free so concurrent runs
do not collide.  The trial directory gets the same layout as in the
emulated network: ``jobs/``, ``events/``, ``logs/``, ``metrics.csv``,
``models/`` (when ``save_model``).  Supervision is
:class:`~testbed.training.supervise.Supervisor`, as in the Mininet runner.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.training.config import TrainingConfig, validate_training
from testbed.training.jobs import Job, Placement, command_for, make_jobs, write_jobs
from testbed.training.supervise import ProcSpec, SupervisionResult, Supervisor

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LocalResult:
    ok: bool
    reason: str
    out_dir: Path
    jobs: list[Job]
    supervision: SupervisionResult

    @property
    def returncodes(self) -> dict[str, int | None]:
        return self.supervision.returncodes()

    def log(self, name: str) -> str:
        p = self.out_dir / "logs" / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def diagnosis(self, tail: int = 4000) -> str:
        """The reason, then the log tail of the process it names first (the one that failed
        first), then the others': what a failed test should print."""
        first = self.supervision.first_failure
        names = sorted(self.returncodes, key=lambda n: (n != first, n))
        parts = [self.reason]
        for n in names:
            parts.append(f"----- {n} (exit {self.returncodes[n]}) -----\n{self.log(n)[-tail:]}")
        return "\n".join(parts)


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1", *, attempts: int = 200) -> int:
    """A port free now and *below* the kernel's ephemeral range.

    Every process of a local trial shares 127.0.0.1, and each outgoing connection (a
    worker to the parameter server, gloo's pair sockets) takes its local port from the
    ephemeral range.  A port picked there (bind to 0) can be taken by one of those
    sockets before rank 0's store or the server binds it, and that rank then dies with
    "address already in use" (seen once in CI).  Ports below the range are never handed
    out implicitly, so only an explicit bind can collide, and we checked that one.
    """
    lo, _ = _ephemeral_range()
    first = max(1024, lo - 12000)
    rng = random.SystemRandom()
    for _ in range(attempts):
        port = rng.randrange(first, lo) if lo > first else 0
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError(f"no free port in {first}..{lo - 1} on {host}")


def loopback_placement(dcs: Mapping[str, int], ps_dc: str | None = None, address: str = "127.0.0.1",
                       with_server: bool = True) -> list[Placement]:
    out = [Placement(f"{dc}{i + 1}", dc, address, "lo") for dc, k in dcs.items() for i in range(k)]
    if with_server:
        out.append(Placement("ps", ps_dc or next(iter(dcs)), address, "lo", role="server"))
    return out


def run_local(cfg: Mapping[str, Any] | TrainingConfig, dcs: Mapping[str, int] | None = None,
              out_dir: str | os.PathLike[str] | None = None, *, ps_dc: str | None = None,
              timeout_s: float = 120.0, grace_s: float = 3.0, env: Mapping[str, str] | None = None,
              python: str | None = None) -> LocalResult:
    """Start all processes of one trial on 127.0.0.1 and supervise them to the end."""
    dcs = dict(dcs or {"a": 2, "b": 2})
    tc = validate_training(cfg)
    data = tc.to_dict()
    data["rendezvous_port"] = free_port()
    data["server_port"] = free_port()
    while data["server_port"] == data["rendezvous_port"]:
        data["server_port"] = free_port()
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="testbed-local-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    placement = loopback_placement(dcs, ps_dc, with_server=tc.uses_server)
    jobs = make_jobs(data, placement, out, time.time_ns())
    paths = write_jobs(jobs, out)
    penv = dict(os.environ if env is None else env)
    penv["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), penv.get("PYTHONPATH", "")]))
    penv.setdefault("PYTHONUNBUFFERED", "1")
    specs = [ProcSpec(j.name, j.role, primary=j.role == "worker", payload=(j, p)) for j, p in zip(jobs, paths)]
    specs.sort(key=lambda s: s.role != "server")  # server first: clients retry until it listens anyway

    def start(spec: ProcSpec) -> subprocess.Popen[bytes]:
        job, path = spec.payload
        with open(out / "logs" / f"{spec.name}.log", "wb") as log:
            return subprocess.Popen(command_for(path, job, python), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=penv, cwd=str(REPO_ROOT))

    result = Supervisor(specs, start, timeout_s=timeout_s, grace_s=grace_s).run()
    return LocalResult(result.ok, result.reason, out, jobs, result)


def main(argv: list[str] | None = None) -> int:
    """``python -m testbed.training.local SPEC.yaml [OUT_DIR]``: run the spec's training section on loopback."""
    from topologies.loader import read_mapping

    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m testbed.training.local SPEC.yaml [OUT_DIR] [dc=count ...]", file=sys.stderr)
        return 2
    spec = read_mapping(Path(argv[0]))
    section = spec.get("training", spec) if isinstance(spec, Mapping) else spec
    out = argv[1] if len(argv) > 1 and "=" not in argv[1] else None
    dcs = {k: int(v) for k, v in (a.split("=", 1) for a in argv[1:] if "=" in a)} or None
    res = run_local(section, dcs, out, timeout_s=float(os.environ.get("TESTBED_LOCAL_TIMEOUT", "600")))
    print(f"{'ok' if res.ok else 'FAILED'}: {res.reason}; results in {res.out_dir}")
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
