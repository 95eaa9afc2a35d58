"""Faults in a running trial, each injected for real into a `testbed run` started as its own process.

Per fault: what the user sees (the trial's reason names the cause), the exit status, how fast it is
noticed (printed as MEASURED), that the records written so far are kept and valid JSON, and that
nothing is left behind.  Injected for real: a worker that SIGSTOPs itself, a worker that allocates
until its host's cgroup memory limit makes the kernel's OOM killer end it, the parameter server
SIGKILLed from outside, a WAN link taken down by the link schedule and kept down, an impairment
daemon SIGKILLed mid-trial, the results file system filled up (a small tmpfs), a read-only one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.network import cleanup
from testbed.training.supervise import process_state
from tests.conftest import REPO, cli_env
from tests.faults.helpers import interruptible, kill_and_clean
from tests.network.helpers import require_root_tools

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow]

TOPO = {"name": "flt", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"a": "a", "b": "b", "rate": "50Mbit", "delay": "5ms"}], "ps": "a"}


def _spec(tmp: Path, scheme: str = "bsp", topology: dict | None = None, **extra: Any) -> Path:
    training = {"workload": {"name": "digits"}, "stop": {"steps": 100000, "wall_s": 90}, "eval_every": 50}
    training.update(extra.pop("training", {}))
    raw = {"name": "flt", "topology": topology or TOPO, "impairment": "auto", "allow_missing_netem": True,
           "timeout": "150s", "training": training, "schemes": [scheme],
           "collectors": {"rate_hz": 5, "trace": False}, "results_dir": str(tmp / "results"), **extra}
    p = tmp / "flt.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


@contextmanager
def _run(spec: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`testbed run SPEC` as a process of its own; killed (and the machine cleaned) if the test fails."""
    require_root_tools()
    assert not cleanup.owned_netns(), "a testbed network is already up"
    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", "run", str(spec), *args], cwd=REPO, env=cli_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield p
    finally:
        kill_and_clean(p)


def _procs(trial_glob: str, role: str) -> list[int]:
    """pids of the trial's training processes of ``role`` (worker | server), from their command lines."""
    module = {"worker": "testbed.training.worker", "server": "testbed.training.server"}[role]
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() in argv and any(trial_glob.encode() in a for a in argv):
            out.append(int(d.name))
    return out


def _wait_training(results: Path, timeout: float = 90) -> Path:
    """The trial directory, once every worker has recorded a span (training is under way)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for events in results.glob("flt/*/trials/*/events"):
            files = list(events.glob("*.worker.*.jsonl"))
            if len(files) >= 2 and all(f.stat().st_size > 0 for f in files):
                return events.parent
        time.sleep(0.2)
    raise AssertionError("training did not start")


def _finish(p: subprocess.Popen[str], timeout: float) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err, time.monotonic() - t0


def _manifest(trial: Path) -> dict[str, Any]:
    m = json.loads((trial / "manifest.json").read_text())
    for f in trial.rglob("*.json"):  # every JSON record is whole
        json.loads(f.read_text())
    return m


def _left() -> int:
    return sum(len(v) for v in cleanup.leftovers().values())


def _report(fault: str, noticed: float, left: int, reason: str) -> None:
    print(f"MEASURED fault {fault}: noticed in {noticed:.1f} s, left behind {left}; reason: {reason[:200]}")


def _failed(fault: str, rc: int, err: str, m: dict[str, Any], noticed: float, detail: str = "") -> None:
    """Print the measurement; the run exited 1 and its trial is marked failed."""
    _report(fault, noticed, _left(), detail + m["reason"])
    assert rc == 1, err
    assert m["status"] == "failed", m["reason"]


def test_a_worker_that_hangs_is_named_after_the_stall_limit(tmp_path: Path) -> None:
    stall = 8.0
    spec = _spec(tmp_path, stall=f"{stall:g}s", training={"fault": {"step": 20, "host": "b-h1", "mode": "stop"}})
    with _run(spec) as p:
        trial = _wait_training(tmp_path / "results")
        t_stop = None
        deadline = time.monotonic() + 60
        while t_stop is None and time.monotonic() < deadline:
            for pid in _procs(str(trial), "worker"):
                if process_state(pid) == "T":
                    t_stop = time.time()
            time.sleep(0.1)
        assert t_stop is not None, "the worker never stopped itself"
        rc, _, err, _ = _finish(p, 120)
    m = _manifest(trial)
    noticed = m["end"] - t_stop
    _failed("worker SIGSTOP", rc, err, m, noticed)
    assert "stalled" in m["reason"] and "b-h1.worker.1 is stopped" in m["reason"], m["reason"]
    assert noticed < stall + 10, f"noticed after {noticed:.1f} s (stall limit {stall:g} s)"
    assert all(p["returncode"] is not None for p in m["processes"])
    assert _left() == 0, cleanup.leftovers()


def test_a_worker_past_its_memory_limit_is_named_out_of_memory(tmp_path: Path) -> None:
    topo = dict(TOPO, dcs=[{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1, "memory": "600MiB"}])
    spec = _spec(tmp_path, topology=topo, training={"fault": {"step": 10, "host": "b-h1", "mode": "oom"}})
    t0 = time.monotonic()
    with _run(spec) as p:
        rc, _, err, _ = _finish(p, 150)
    took = time.monotonic() - t0
    trial = next((tmp_path / "results").glob("flt/*/trials/*"))
    m = _manifest(trial)
    _failed("worker over its memory limit", rc, err, m, took)
    assert "out of memory: b-h1 hit its memory limit 600 MiB" in m["reason"], m["reason"]
    assert m["memory"]["b-h1"]["oom_kills"] >= 1
    assert m["memory"]["b-h1"]["peak"] <= 600 * 2**20 + 2**20
    codes = {p["host"]: p["returncode"] for p in m["processes"] if p["role"] == "worker"}
    assert codes["b-h1"] == -signal.SIGKILL
    assert took < 120
    assert _left() == 0, cleanup.leftovers()


def test_the_parameter_server_killed_stops_every_worker_and_is_named(tmp_path: Path) -> None:
    spec = _spec(tmp_path, scheme="asp")
    with _run(spec) as p:
        trial = _wait_training(tmp_path / "results")
        (server,) = _procs(str(trial), "server")
        os.kill(server, signal.SIGKILL)
        t_kill = time.time()
        rc, _, err, _ = _finish(p, 60)
    m = _manifest(trial)
    noticed = m["end"] - t_kill
    _failed("parameter server SIGKILL", rc, err, m, noticed)
    assert "server" in m["reason"] and "exited with status -9" in m["reason"], m["reason"]
    assert not _procs(str(trial), "worker"), "a worker outlived the trial"
    assert noticed < 15
    assert _left() == 0, cleanup.leftovers()


def test_a_wan_link_that_goes_down_and_stays_down_times_out_and_is_named(tmp_path: Path) -> None:
    comm = 8.0
    sched = tmp_path / "down.csv"
    sched.write_text("time,link,rate,delay,jitter,loss,state\n25,a-b,,,,,down\n")
    spec = _spec(tmp_path, schedule=str(sched), stall="120s", training={"comm_timeout_s": comm})
    with _run(spec) as p:
        trial = _wait_training(tmp_path / "results")
        rc, _, err, _ = _finish(p, 120)
    m = _manifest(trial)
    down_at = m["t0_ns"] / 1e9 + 25  # a schedule's times count from the trial's t0, as its records do
    noticed = m["end"] - down_at
    _failed("WAN link down for good", rc, err, m, noticed)
    assert "WAN link down at the time: a<->b" in m["reason"], m["reason"]
    assert noticed < comm + 15, f"noticed {noticed:.1f} s after the link went down (comm timeout {comm:g} s)"
    assert _left() == 0, cleanup.leftovers()


@pytest.mark.parametrize("sig,bound", [(signal.SIGKILL, 1.0), (signal.SIGSTOP, 3.0 + 1.0)])
def test_an_impairment_daemon_killed_or_hung_mid_trial_fails_it(tmp_path: Path, sig: int, bound: float) -> None:
    """Killed: noticed within 1 s (its exit); hung (SIGSTOP): within 3 s (its heartbeat goes silent) + a poll."""
    from traffic_control.userspace import available

    ok, why = available()
    if not ok:
        pytest.skip(f"userspace backend not usable here ({why})")
    spec = _spec(tmp_path, impairment="userspace")
    with _run(spec) as p:
        trial = _wait_training(tmp_path / "results")
        health = sorted(Path("/run/geo-testbed/impair").glob("*/health.json"))
        assert health, "no impairment daemon"
        os.kill(int(json.loads(health[0].read_text())["pid"]), sig)
        t_kill = time.time()
        rc, _, err, _ = _finish(p, 60)
    m = _manifest(trial)
    noticed = m["impairment_failures"][0]["time"] - t_kill
    _failed(f"impairment daemon {signal.Signals(sig).name} mid-trial", rc, err, m, noticed,
            f"trial ended {m['end'] - t_kill:.1f} s after; ")
    assert "network no longer matches the spec" in m["reason"], m["reason"]
    assert noticed < bound, f"noticed after {noticed:.2f} s"
    assert m["end"] - t_kill < 15
    assert (trial / "metrics.csv").stat().st_size > 0, "records kept"
    assert _left() == 0, cleanup.leftovers()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "fs"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tb-test-fs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_results_disk_full_stops_the_run_with_earlier_trials_intact(tmp_path: Path, small_fs: Path) -> None:
    spec = _spec(tmp_path, results_dir=str(small_fs), training={"stop": {"steps": 40}})
    raw = yaml.safe_load(spec.read_text())
    raw["schemes"] = ["bsp", "asp", "gsyn"]
    spec.write_text(yaml.safe_dump(raw))
    with _run(spec) as p:
        deadline = time.monotonic() + 120
        first = None
        while first is None and time.monotonic() < deadline:
            first = next(small_fs.glob("flt/*/trials/bsp-r0/manifest.json"), None)
            time.sleep(0.1)
        assert first is not None, "the first trial never finished"
        filler = small_fs / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True)  # until ENOSPC
        t_full = time.monotonic()
        rc, out, err, _ = _finish(p, 120)
    noticed = time.monotonic() - t_full
    _report("results disk full", noticed, _left(), err.strip().splitlines()[-1])
    assert rc == 1, err
    assert "No space left on device" in err and "intact" in err, err
    assert "Traceback" not in err, err
    m = json.loads(first.read_text())
    assert m["status"] == "ok", "the finished trial's record is whole"
    for f in small_fs.rglob("*.json"):  # nothing half-written (atomic writes)
        try:
            json.loads(f.read_text())
        except ValueError as e:
            raise AssertionError(f"{f} is not whole: {e}") from None
    assert not list(small_fs.rglob(".*.tmp")), "no temporary left"
    assert _left() == 0, cleanup.leftovers()


def test_a_read_only_results_directory_is_refused_before_building(tmp_path: Path, small_fs: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    spec = _spec(tmp_path, results_dir=str(small_fs / "results"))
    with _run(spec) as p:
        rc, _, err, took = _finish(p, 60)
    _report("read-only results directory", took, _left(), err.strip())
    assert rc == 2, err
    assert "results_dir" in err and "Read-only file system" in err, err
    assert _left() == 0, cleanup.leftovers()


@pytest.mark.parametrize("when", ["building", "training", "twice"])
def test_ctrl_c_stops_a_run_within_seconds_keeps_records_and_exits_130(tmp_path: Path, when: str) -> None:
    require_root_tools()
    assert not cleanup.owned_netns(), "a testbed network is already up"
    spec = _spec(tmp_path)
    p = interruptible(["run", str(spec)])
    try:
        if when == "building":
            deadline = time.monotonic() + 60
            while not Path("/run/geo-testbed").exists() and not cleanup.owned_netns() \
                    and time.monotonic() < deadline:
                time.sleep(0.02)
        else:
            _wait_training(tmp_path / "results")
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        if when == "twice":
            time.sleep(0.3)
            p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        kill_and_clean(p)
    took = time.monotonic() - t0
    trial = next((tmp_path / "results").glob("flt/*/trials/*"))
    m = _manifest(trial)
    _report(f"Ctrl-C during {when}", took, _left(), m["reason"])
    assert p.returncode == 130, err
    assert "Traceback" not in err, err
    assert m["status"] == "interrupted"
    assert took < 10, f"stopped {took:.1f} s after Ctrl-C"
    assert _left() == 0, cleanup.leftovers()


def test_ctrl_c_stops_a_sweep_exits_130_and_the_rerun_resumes(tmp_path: Path) -> None:
    require_root_tools()
    assert not cleanup.owned_netns(), "a testbed network is already up"
    exp = yaml.safe_load(_spec(tmp_path, training={"stop": {"steps": 20}}).read_text())
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(exp))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "flts", "experiment": "exp.yaml",
                                     "grid": {"wan.delay": ["1ms", "2ms"]}}))
    out = tmp_path / "out"
    p = interruptible(["sweep", str(sweep), "--out", str(out)])
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("points/*/trials/*/events/*.worker.*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        kill_and_clean(p)
    took = time.monotonic() - t0
    _report("Ctrl-C during a sweep", took, _left(), err.strip().splitlines()[-1])
    assert p.returncode == 130, err
    assert took < 10
    assert _left() == 0, cleanup.leftovers()
    assert not list(out.glob("points/*/done.json")), "the interrupted point is not marked done"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "sweep", str(sweep), "--out", str(out)], cwd=REPO,
                       env=cli_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert len(list(out.glob("points/*/done.json"))) == 2
