"""Shared fixtures: root check, topology files in tmp_path, the CLI, and a leftover check.

The leftover check (``make test`` turns it on) runs at the end of a session that ran as
root: any ``tb-*`` network namespace, root-namespace link, cgroup or marked process
that was not there when the session started is reported and the session fails.
Nothing is removed there (``testbed clean`` does that).  It also runs after each
module's last test: what that module left is removed and fails its last test, so
that one module's failure does not fail every later one.  Objects of other
prefixes (``uqt*``, ``cltest*``, ``decoy*``...) are never looked at.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def need_root() -> None:
    """Skip the test unless it runs as root (network namespaces, tc, cgroups)."""
    if not is_root():
        pytest.skip("needs root (network namespaces and tc)")


def _write(tmp_path: Path, spec: dict[str, Any] | str, name: str = "topo.yaml") -> Path:
    p = tmp_path / name
    if isinstance(spec, str):
        p.write_text(spec)
    elif name.endswith(".json"):
        p.write_text(json.dumps(spec))
    else:
        p.write_text(yaml.safe_dump(spec, sort_keys=False))
    return p


@pytest.fixture
def write_topology(tmp_path: Path) -> Callable[..., Path]:
    """``write_topology(spec_dict_or_text, name="topo.yaml") -> Path`` inside tmp_path."""

    def write(spec: dict[str, Any] | str, name: str = "topo.yaml") -> Path:
        return _write(tmp_path, spec, name)

    return write


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("TESTBED_OWNER", None)  # never let a test's CLI look like a testbed-owned process
    return env


def fake_gpus(bin_dir: Path, count: int) -> Path:
    """A stand-in ``nvidia-smi`` in ``bin_dir`` that lists ``count`` devices, answering the one query the
    testbed makes (``testbed.network.gpus.machine_gpus``); ``bin_dir``, to go first on a PATH.  (No GPU here:
    what it stands in for is which devices each server has, so that each server's assignment can be seen.)"""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    rows = "".join(f"echo '{i}, Stand-in GPU {i}, 16384'\n" for i in range(count))
    smi.write_text(f"#!/bin/sh\ncase \"$*\" in *--query-gpu=index,name,memory.total*) ;; *) exit 9;; esac\n{rows}")
    smi.chmod(0o755)
    return bin_dir


def run_cli(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m testbed.cli ARGS`` from the repository root; stdout and stderr captured."""
    r = subprocess.run([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, env=cli_env(),
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"testbed {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_cli


def tb_objects() -> dict[str, list[str]]:
    """Every ``tb-*`` object on the machine (namespaces, links, cgroups, marked processes)."""
    from testbed.network.cleanup import leftovers

    return leftovers()


# ------------------------------------------------------------ leftover check
_AT_START: dict[str, list[str]] = {}


def _check_enabled() -> bool:
    """Opt-in (``TESTBED_LEFTOVER_CHECK=1``, set by ``make test``): on a shared development machine
    another session's live network would look like this session's leftovers."""
    return is_root() and os.environ.get("TESTBED_LEFTOVER_CHECK") == "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    if _check_enabled():
        try:
            _AT_START.update(tb_objects())
        except Exception:  # pragma: no cover - a broken import is reported by the tests themselves
            pass


def _new_objects(wait_s: float = 0.0) -> dict[str, list[str]]:
    """tb-* objects that were not there when the session started; waits up to ``wait_s`` for them to go
    (a process that was just killed may take a moment to leave its namespace)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            now = tb_objects()
        except Exception:  # pragma: no cover - a broken import is reported by the tests themselves
            return {}
        new = {k: sorted(set(v) - set(_AT_START.get(k, []))) for k, v in now.items()}
        new = {k: v for k, v in new.items() if v}
        if not new or time.monotonic() >= deadline:
            return new
        time.sleep(0.5)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """After a module's last test (its module fixtures torn down): what it left behind is removed and
    fails that test, so that one failure stays one failure.  Before this, a Ctrl-C test that left a
    network up (CI, stop 47) failed the 29 root tests after it with "a testbed network is already up"."""
    try:
        out = yield
    finally:
        left = {}
        if _check_enabled() and (nextitem is None or nextitem.path != item.path):
            left = _new_objects(wait_s=5.0)
            if left:
                from testbed.network import cleanup

                cleanup.cleanup()
    if left:
        raise AssertionError(f"{item.path.name} left testbed objects behind: {json.dumps(left)} "
                             "(removed here, so that the next module starts clean)")
    return out


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _check_enabled():
        return
    new = _new_objects()
    if not new:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    msg = ("testbed objects that appeared during this session and are still there: " + json.dumps(new)
           + " -- remove them with `testbed clean` (not done here: they might belong to a network "
           "someone else brought up meanwhile)")
    if tr is not None:
        tr.write_sep("=", "tb-* LEFTOVERS", red=True)
        tr.write_line(msg)
    else:  # pragma: no cover
        print(msg, file=sys.stderr)
    if session.exitstatus == 0:
        session.exitstatus = 1
