"""Faults of the network builder, injected for real (issue: faults survived).

Each test breaks something for real (a failing ``mnexec`` first on the PATH,
a Ctrl-C to the command) and checks what the user sees, the exit status, how
fast, and that nothing is left behind.  The measured times are printed
(``pytest -s``): ``MEASURED <fault>: noticed in X s, left behind N``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.network import cleanup
from tests.conftest import REPO, cli_env
from tests.faults.helpers import interruptible, kill_and_clean
from tests.network.helpers import require_root_tools

pytestmark = pytest.mark.root

#: mnexec that fails the way it did on a machine whose / is not a mount point, for the
#: node shells only (Mininet starts them with -cdn); every other use goes to the real one.
FAILING_MNEXEC = """#!/bin/sh
case "$1" in
  -cdn|-cn|-dn) echo "remount: Invalid argument" >&2; exit 1 ;;
esac
exec {real} "$@"
"""


def _left() -> int:
    return sum(len(v) for v in cleanup.leftovers().values())


@pytest.fixture
def failing_mnexec(tmp_path: Path) -> dict[str, str]:
    require_root_tools()
    real = shutil.which("mnexec")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "mnexec").write_text(FAILING_MNEXEC.format(real=real))
    (shim / "mnexec").chmod(0o755)
    env = cli_env()
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_a_shell_that_cannot_start_is_named_quickly_and_leaves_nothing(failing_mnexec):
    assert not cleanup.owned_netns(), "a testbed network is already up"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "net", "up", "two_dc", "--impairment", "none",
                        "--allow-missing-netem"], cwd=REPO, env=failing_mnexec, capture_output=True, text=True,
                       timeout=120)
    took = time.monotonic() - t0
    left = _left()
    print(f"MEASURED node shell fails to start: noticed in {took:.1f} s, left behind {left}")
    assert r.returncode == 1, r.stderr
    assert "node east-h1" in r.stderr and "remount: Invalid argument" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert took < 10, f"noticed after {took:.1f} s"
    assert left == 0, cleanup.leftovers()


def test_ctrl_c_while_net_up_builds_cleans_up_and_exits_130(tmp_path):
    """Ctrl-C at several moments of `net up` (a bigger network, so that building takes a while)."""
    require_root_tools()
    assert not cleanup.owned_netns(), "a testbed network is already up"
    for delay in (0.3, 0.8, 1.1, 1.5, 2.5):
        p = interruptible(["net", "up", "geo_wan", "--impairment", "none", "--allow-missing-netem"])
        time.sleep(delay)
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        try:
            _, err = p.communicate(timeout=30)
        finally:
            kill_and_clean(p)
        took = time.monotonic() - t0
        if p.returncode == 0:  # it was faster than the Ctrl-C: the network is up, which is fine; take it down
            subprocess.run([sys.executable, "-m", "testbed.cli", "net", "down"], cwd=REPO, env=cli_env(),
                           capture_output=True, timeout=120)
            continue
        left = _left()
        print(f"MEASURED Ctrl-C {delay:g} s into net up: stopped in {took:.1f} s, exit {p.returncode}, "
              f"left behind {left}")
        assert p.returncode == 130, err
        assert took < 10
        assert left == 0, cleanup.leftovers()


#: `net up` of two_dc in a process of its own whose SIGINT is raised at one exact moment of the build:
#: a timed Ctrl-C from outside hits the narrow moments once in ~70 tries (CI, stop 47: the handles closing).
AT_A_MOMENT = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from testbed import cli
from testbed.network.emulation import EmulatedNetwork

moment = sys.argv[1]
if moment == "closing its netlink handles":
    close = EmulatedNetwork._close_handles
    def _close_handles(self):
        if self._handles and not getattr(self, "_pressed", False):
            self._pressed = True
            os.kill(os.getpid(), signal.SIGINT)  # the handler raises at the next bytecode, in here
        close(self)
    EmulatedNetwork._close_handles = _close_handles
elif moment == "start returned":
    start = EmulatedNetwork.start
    def _start(self):
        out = start(self)
        os.kill(os.getpid(), signal.SIGINT)
        return out
    EmulatedNetwork.start = _start
sys.exit(cli.main(["net", "up", "two_dc", "--impairment", "none", "--allow-missing-netem"]))
"""


@pytest.mark.parametrize("moment", ["closing its netlink handles", "start returned"])
def test_ctrl_c_at_the_end_of_net_up_leaves_nothing(tmp_path, moment):
    """The last moments of the build, after every object exists but before `net up` reports success."""
    require_root_tools()
    assert not cleanup.owned_netns(), "a testbed network is already up"
    script = tmp_path / "at_a_moment.py"
    script.write_text(AT_A_MOMENT.format(repo=str(REPO)))
    p = subprocess.Popen([sys.executable, str(script), moment], cwd=REPO, env=cli_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _, err = p.communicate(timeout=120)
    finally:
        kill_and_clean(p)
    left = cleanup.leftovers()  # under `make test` the module's leftover check removes them (tests/conftest.py)
    assert p.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert not left, left
