"""A container trainer's first act: every capability gone, for itself and whatever it executes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, socket, subprocess
from testbed.training.privileges import apply_from_env
after = apply_from_env()
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)  # needs CAP_NET_RAW
    raw = "allowed"
except PermissionError:
    raw = "refused"
child = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
print(json.dumps({"after": after, "raw": raw,
                  "child": [l.split()[1] for l in child.splitlines() if l.startswith(("CapEff", "CapPrm", "CapBnd"))]}))
"""


def _probe(drop: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TESTBED_DROP_CAPS", None)
    if drop:
        env["TESTBED_DROP_CAPS"] = "1"
    r = subprocess.run(["unshare", "-n", sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.root
def test_a_container_trainer_drops_every_capability_and_its_children_have_none():
    if os.geteuid() != 0:
        pytest.skip("needs root")
    kept = _probe(drop=False)  # what a process entered from the host has: the host root's sets
    assert kept["after"] is None and kept["raw"] == "allowed" and int(kept["child"][0], 16) != 0
    got = _probe(drop=True)
    zero = "0" * 16
    assert {got["after"][k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {zero}
    assert got["after"]["NoNewPrivs"] == "1"
    assert got["raw"] == "refused" and got["child"] == [zero, zero, zero]
