"""What the fault tests share: the CLI as a process of its own, and never leaving it behind."""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.conftest import REPO, cli_env


def interruptible(argv: list[str]) -> subprocess.Popen[str]:
    """`testbed ARGV` with SIGINT at its default (a background job of a script inherits it ignored)."""
    return subprocess.Popen([sys.executable, "-m", "testbed.cli", *argv], cwd=REPO, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def kill_and_clean(p: subprocess.Popen[str]) -> None:
    """If the CLI is still running (the test failed or timed out): SIGKILL it and `testbed clean`."""
    if p.poll() is None:
        p.kill()
        p.wait()
        subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], cwd=REPO, env=cli_env(),
                       capture_output=True, timeout=120)
