#!/usr/bin/env python3
"""`testbed net up` time for one topology on 1, 2 and 3 servers (issue 19's bar), side by side in one run.

The servers are stand-ins on this machine (network namespaces with their own sshd: tests/cluster/standins.py),
reached over SSH only, so the number includes what the cluster adds on real servers (ssh connections, each
remote part built by its own `testbed` process) but not a real network's latency.  All servers share this
machine's two cores: the parts are built at once (remote ones over ssh, the launcher's meanwhile), so here
they compete for CPU where real servers would not.  Each configuration is brought up and down ``--rounds`` times, the
configurations alternating; the median is printed.  Needs root, openssh-server and gcc.

    sudo .venv/bin/python benchmarks/cluster_up.py [--topology geo_wan] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.cluster.standins import StandInServers  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def testbed(*args: str) -> float:
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"testbed {' '.join(args)} exited {r.returncode}: {r.stderr[-1500:]}")
    return time.monotonic() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--topology", default="geo_wan")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cluster-up-"))
    servers = StandInServers(work, 2).start()
    try:
        files = {}
        for n in (2, 3):
            spec = servers.cluster()
            spec["servers"] = spec["servers"][:n]
            files[n] = work / f"cluster{n}.yaml"
            files[n].write_text(yaml.safe_dump(spec))
        times: dict[int, list[float]] = {1: [], 2: [], 3: []}
        for r in range(args.rounds):
            for n in (1, 2, 3):
                if n == 1:
                    times[1].append(testbed("net", "up", args.topology))
                    testbed("net", "down")
                else:
                    times[n].append(testbed("net", "up", args.topology, "--cluster", str(files[n])))
                    testbed("net", "down", "--cluster", str(files[n]))
                print(f"round {r + 1}: {n} server(s) {times[n][-1]:.2f} s", file=sys.stderr, flush=True)
        base = statistics.median(times[1])
        for n in (1, 2, 3):
            m = statistics.median(times[n])
            print(f"{args.topology} on {n} server(s): net up {m:.2f} s (median of {args.rounds}: "
                  f"{', '.join(f'{x:.2f}' for x in times[n])}), {m / base:.2f} x one server")
    finally:
        subprocess.run([sys.executable, "-m", "testbed.cli", "net", "down"], cwd=REPO, capture_output=True)
        servers.stop()


if __name__ == "__main__":
    main()
