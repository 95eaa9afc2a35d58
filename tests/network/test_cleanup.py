"""Cleanup after the builder was SIGKILLed (mid-way and once up): every tb-* object goes, nothing else.

Decoys of other names (a namespace ``decoy-x``, a bridge ``decoy0``, and a bridge
``tbdecoy0``, which shares the prefix letters but not ``tb-``) must survive.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from pyroute2 import IPRoute, netns

from testbed.network import cleanup
from tests.conftest import REPO, cli_env
from tests.network.helpers import require_root_tools

pytestmark = pytest.mark.root

CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from topologies import from_dict
    from testbed.network.emulation import EmulatedNetwork

    mode = sys.argv[1]
    topo = from_dict({{"name": "killme", "dcs": [{{"name": "a", "hosts": 2, "cpu": 0.5}}, {{"name": "b", "hosts": 2}}],
                      "links": [{{"a": "a", "b": "b", "rate": "50Mbit"}}], "ps": "a"}})
    net = EmulatedNetwork(topo, impairment="none", allow_missing_netem=True)
    if mode == "midway":
        orig, calls = net._configure_routes, [0]
        def slow(node):
            calls[0] += 1
            if calls[0] == 3:  # nodes, cgroups, bridges and some veths exist; routes half done
                print("MIDWAY", flush=True)
                time.sleep(300)
            orig(node)
        net._configure_routes = slow
    net.start()
    net.popen("a-h1", ["sleep", "300"])  # a testbed-owned process inside a host
    net.popen("b-h2", ["sh", "-c", "sleep 300 & sleep 300"])
    print("UP", flush=True)
    time.sleep(300)
""")


DECOY_NS = "decoy-x"
DECOY_LINKS = ("decoy0", "tbdecoy0")


@pytest.fixture
def decoys():
    require_root_tools()
    if DECOY_NS not in netns.listnetns():
        netns.create(DECOY_NS)
    with IPRoute() as ip:
        for name in DECOY_LINKS:
            if not ip.link_lookup(ifname=name):
                ip.link("add", ifname=name, kind="bridge")  # no dummy module on every kernel
    try:
        yield
    finally:
        with IPRoute() as ip:
            for name in DECOY_LINKS:
                idx = ip.link_lookup(ifname=name)
                if idx:
                    ip.link("del", index=idx[0])
        if DECOY_NS in netns.listnetns():
            netns.remove(DECOY_NS)


def _decoys_alive() -> bool:
    with IPRoute() as ip:
        links = all(ip.link_lookup(ifname=n) for n in DECOY_LINKS)
    return links and DECOY_NS in netns.listnetns()


def _start_and_kill(tmp_path, mode: str) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repo=str(REPO)))
    env = cli_env()
    p = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=REPO)
    marker = "MIDWAY" if mode == "midway" else "UP"
    deadline = time.monotonic() + 90
    lines: list[str] = []
    try:
        while time.monotonic() < deadline and marker not in lines:
            r, _, _ = select.select([p.stdout], [], [], 1.0)
            if r:
                line = p.stdout.readline()
                if not line:
                    break
                lines.append(line.strip())
            elif p.poll() is not None:
                break
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        err = p.stderr.read()
        p.stdout.close()
        p.stderr.close()
    assert marker in lines, f"child never reached {marker} (rc {p.returncode}): {lines} {err[-2000:]}"


@pytest.mark.parametrize("mode", ["midway", "up"])
def test_cleanup_after_sigkill(tmp_path, decoys, mode):
    assert not cleanup.leftovers(), "a testbed network is already up"
    try:
        _start_and_kill(tmp_path, mode)
        left = cleanup.leftovers()
        # the kill really left things behind (otherwise this test proves nothing)
        assert left.get("netns") and left.get("cgroups"), left
        # nothing of the LANs is in the root namespace: the switches have their own namespaces
        assert not left.get("links"), left
        if mode == "up":
            assert len(left["netns"]) == 2 * 3 + 1 + 2  # 4 hosts + ps + 2 routers + 2 switches
            # the hosts' shells die with their pty; processes started in hosts outlive the builder
            assert len(left.get("processes", [])) >= 3, left
    finally:
        removed = cleanup.cleanup()
    assert removed.get("netns")
    assert cleanup.leftovers() == {}
    assert _decoys_alive()
    # idempotent
    assert cleanup.cleanup() == {}
    assert _decoys_alive()


def test_testbed_clean_command(tmp_path, decoys):
    from tests.conftest import run_cli

    assert not cleanup.leftovers(), "a testbed network is already up"
    try:
        _start_and_kill(tmp_path, "up")
        assert cleanup.leftovers()
    except BaseException:
        cleanup.cleanup()
        raise
    r = run_cli("clean")
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stderr
    assert cleanup.leftovers() == {}
    assert _decoys_alive()
    r = run_cli("net", "down")
    assert r.returncode == 0 and "nothing to remove" in r.stderr
