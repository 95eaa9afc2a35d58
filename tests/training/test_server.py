"""Parameter server in-process: a re-sent push is applied once; reconnects; unknown clients."""

from __future__ import annotations

import json
import socket
import threading

import pytest

torch = pytest.importorskip("torch")
from testbed.collect.recorder import Recorder  # noqa: E402
from testbed.training.jobs import make_jobs  # noqa: E402
from testbed.training.local import free_port, loopback_placement  # noqa: E402
from testbed.training.psclient import PSClient  # noqa: E402
from testbed.training.server import ParameterServer  # noqa: E402
from testbed.training.wire import recv_msg, send_msg  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def server(tmp_path):
    cfg = {"workload": {"name": "digits", "batch_size": 4}, "scheme": "asp", "server_port": free_port(),
           "rendezvous_port": free_port(), "optimizer": {"lr": 0.1}}
    jobs = make_jobs(cfg, loopback_placement({"a": 2}), tmp_path, 0)
    rec = Recorder(None, host="ps", role="server", rank=2, flush_interval_s=0)
    ps = ParameterServer(jobs[-1], rec, evaluate=False)
    ready = threading.Event()
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", ps.serve(ready, bye_grace_s=0.5)), daemon=True)
    t.start()
    assert ready.wait(10)
    yield ps, jobs, rec, t, result


def applies(rec):
    rec.flush()
    return [json.loads(line) for line in rec.lines if json.loads(line)["phase"] == "apply"]


def test_repeated_push_is_applied_once(server):
    ps, jobs, rec, thread, result = server
    job = jobs[-1]
    n = ps.flat.n
    with socket.create_connection(("127.0.0.1", job.server_port)) as s:
        send_msg(s, {"op": "hello", "client": 0})
        hdr, payload, _ = recv_msg(s)
        assert hdr["version"] == 0 and len(payload) == 4 * n
        grad = torch.full((n,), 0.5).numpy()
        push = {"op": "push", "client": 0, "seq": 0, "step": 0, "version": 0, "last": False}
        send_msg(s, push, grad)
        first, p1, _ = recv_msg(s)
        p1 = bytes(p1)
        send_msg(s, push, grad)  # the same update again (a client retrying after a lost reply)
        second, p2, _ = recv_msg(s)
        assert first["version"] == second["version"] == 1
        assert not first["dup"] and second["dup"]
        assert bytes(p2) == p1  # the model did not move a second time
        send_msg(s, {"op": "push", "client": 7, "seq": 0, "step": 0, "version": 0}, grad)
        assert recv_msg(s)[0]["op"] == "error"
    got = applies(rec)
    assert [a.get("dup", False) for a in got] == [False, True]
    assert ps.applied == 1 and ps.version == 1


def test_client_reconnects_and_server_exits_after_byes(server):
    ps, jobs, rec, thread, result = server
    job = jobs[-1]
    c0 = PSClient("127.0.0.1", job.server_port, 0, rec, connect_timeout_s=5, timeout_s=10)
    c1 = PSClient("127.0.0.1", job.server_port, 1, rec, connect_timeout_s=5, timeout_s=10)
    r = c0.hello()
    grad = torch.ones(ps.flat.n)
    r = c0.push(0, r.version, grad)
    assert r.version == 1
    c0.sock.close()  # the connection breaks; the next push reconnects transparently
    c0.sock = socket.socket()
    c0.sock.close()
    r = c0.push(1, r.version, grad)
    assert r.version == 2 and r.header["staleness"] == 0
    c1.hello()
    r1 = c1.push(0, 0, grad, last=True)
    assert r1.header["staleness"] == 2
    c0.bye()
    c1.bye()
    thread.join(10)
    assert result["rc"] == 0
    assert [a["staleness"] for a in applies(rec)] == [0, 0, 2]
