"""Host limits through cgroups, measured on real processes: a memory limit binds, OOM kills are counted,
and every group is found and removed wherever it was made (on v1: inside the testbed's own group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.network import cgroups, cleanup

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

NODE = "cgtest-h1"
HOG = ("import time\nhog = []\nfor _ in range(64):\n    hog.append(bytearray(b'\\1' * (16 << 20)))\n"
       "print('survived', len(hog) * 16, 'MiB', flush=True)\ntime.sleep(30)")


@pytest.fixture
def limited():
    if not cgroups.available("memory"):
        pytest.skip("no cgroup memory controller")
    yield
    cgroups.remove_all()


def test_a_process_past_its_memory_limit_is_oom_killed_and_counted(limited):
    holder = subprocess.Popen(["sleep", "60"])  # the "shell" the group is made for
    try:
        made = cgroups.limit(NODE, holder.pid, cores=0.5, memory_bytes=128 * 2**20)
        assert made and all(os.path.isdir(p) for p in made)
        t0 = time.monotonic()
        hog = subprocess.run([sys.executable, "-c", HOG], preexec_fn=cgroups.preexec(NODE), capture_output=True,
                             text=True, timeout=60)
        took = time.monotonic() - t0
        print(f"MEASURED memory limit 128 MiB: hog of 1 GiB ended by signal {-hog.returncode} after {took:.1f} s, "
              f"peak {cgroups.memory_peak(NODE) / 2**20:.0f} MiB, OOM kills {cgroups.oom_kills(NODE)}")
        assert hog.returncode == -signal.SIGKILL, hog.stdout + hog.stderr
        assert "survived" not in hog.stdout
        assert cgroups.oom_kills(NODE) >= 1
        assert cgroups.memory_peak(NODE) <= 128 * 2**20 + 2**20
        # a process outside the group is not limited: the same hog survives
        free = subprocess.run([sys.executable, "-c", HOG.replace("time.sleep(30)", "")], capture_output=True,
                              text=True, timeout=60)
        assert free.returncode == 0 and "survived 1024 MiB" in free.stdout, free.stderr
    finally:
        holder.kill()
        holder.wait()
    assert any(NODE in p for p in cleanup.leftovers().get("cgroups", []))
    removed = cgroups.remove_all()
    assert len(removed) == len(made)
    assert not cleanup.leftovers().get("cgroups")


def test_v1_groups_are_made_inside_the_testbeds_own_group(limited):
    if cgroups._v2():
        pytest.skip("cgroup v2: one tree, groups at its root")
    own = cgroups._own_v1_group("memory")
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (path,) = [p for p in cgroups.limit(NODE, holder.pid, memory_bytes=256 * 2**20) if "memory" in p]
        assert path == f"/sys/fs/cgroup/memory{own.rstrip('/')}/tb-{NODE}", (path, own)
        assert f"memory:{own.rstrip('/')}/tb-{NODE}" in Path(f"/proc/{holder.pid}/cgroup").read_text()
    finally:
        holder.kill()
        holder.wait()
