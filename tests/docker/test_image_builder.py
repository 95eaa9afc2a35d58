"""The image builder's work tree: a killed builder's tree is removed by `testbed clean`, its mounts first,
so removing it never reaches into a mounted file system (debootstrap mounts /proc and /sys in its target)."""

from __future__ import annotations

import os
import subprocess

import pytest

from testbed.images import builder
from tests.conftest import run_cli

pytestmark = [pytest.mark.root, pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount)")]


def test_clean_removes_a_dead_builders_tree_but_never_through_a_mount(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the host's file")
    work = builder.WORK_ROOT / (builder.WORK_PREFIX + "testdead")
    (work / "rootfs" / "mnt").mkdir(parents=True, exist_ok=True)
    (work / "builder.pid").write_text("999999999")  # no such process: the builder is gone
    subprocess.run(["mount", "--bind", str(outside), str(work / "rootfs" / "mnt")], check=True)
    live = builder.WORK_ROOT / (builder.WORK_PREFIX + "testlive")
    live.mkdir(exist_ok=True)
    (live / "builder.pid").write_text(str(os.getpid()))  # a builder that still runs: left alone
    try:
        r = run_cli("clean", timeout=120)
        assert r.returncode == 0, r.stderr
        assert "image_work: 1" in r.stdout + r.stderr
        assert not work.exists() and live.exists()
        assert (outside / "keep.txt").read_text() == "the host's file"
    finally:
        subprocess.run(["umount", "--lazy", str(work / "rootfs" / "mnt")], capture_output=True)
        builder.remove_work(live)


def test_the_recipe_pins_what_this_environment_runs():
    req = builder.pinned_requirements()
    names = {r.split("==")[0].lower() for r in req}
    assert {"torch", "numpy", "scikit-learn", "pyyaml", "pydantic"} <= names
    assert not names & set(builder.NOT_IN_IMAGE) and all("==" in r and "+" not in r for r in req)
