"""Supervisor: success, a crash stops the others within seconds, lingering processes, start failure."""

from __future__ import annotations

import subprocess
import sys
import time

from testbed.training.supervise import ProcSpec, Supervisor


def py(code: str):
    def start(spec: ProcSpec):
        return subprocess.Popen([sys.executable, "-c", spec.payload or code])

    return start


def test_all_ok():
    specs = [ProcSpec(f"h{i}.worker.{i}", payload="import time; time.sleep(0.2)") for i in range(3)]
    res = Supervisor(specs, py(""), timeout_s=30).run()
    assert res.ok and res.reason == "ok" and set(res.returncodes().values()) == {0}


def test_crash_stops_the_rest_quickly():
    specs = [ProcSpec("h0.worker.0", payload="import time; time.sleep(60)"),
             ProcSpec("h1.worker.1", payload="import time; time.sleep(0.3); raise SystemExit(3)"),
             ProcSpec("ps.server.2", role="server", primary=False, payload="import time; time.sleep(60)")]
    t = time.monotonic()
    res = Supervisor(specs, py(""), timeout_s=60, grace_s=2).run()
    took = time.monotonic() - t
    assert not res.ok and res.first_failure == "h1.worker.1" and "status 3" in res.reason
    assert took < 10, took
    by = {p.name: p for p in res.procs}
    assert by["h0.worker.0"].stopped and by["h0.worker.0"].returncode is not None
    assert by["ps.server.2"].stopped


def test_sigterm_ignored_gets_killed():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    specs = [ProcSpec("h0.worker.0", payload=code), ProcSpec("h1.worker.1", payload="raise SystemExit(1)")]
    t = time.monotonic()
    res = Supervisor(specs, py(""), timeout_s=60, grace_s=1).run()
    assert not res.ok and time.monotonic() - t < 10
    assert res.returncodes()["h0.worker.0"] == -9


def test_server_that_does_not_exit_fails_the_run():
    specs = [ProcSpec("h0.worker.0", payload="pass"),
             ProcSpec("ps.server.1", role="server", primary=False, payload="import time; time.sleep(60)")]
    res = Supervisor(specs, py(""), timeout_s=60, drain_s=0.5, grace_s=1).run()
    assert not res.ok and "ps.server.1" in res.reason


def test_start_failure_and_timeout():
    def start(spec):
        if spec.name == "bad":
            raise OSError("no such host")
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    res = Supervisor([ProcSpec("good"), ProcSpec("bad")], start, grace_s=1).run()
    assert not res.ok and res.first_failure == "bad" and res.procs[0].stopped
    res = Supervisor([ProcSpec("good")], start, timeout_s=0.5, grace_s=1).run()
    assert not res.ok and "timeout" in res.reason
