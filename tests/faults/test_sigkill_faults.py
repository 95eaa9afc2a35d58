"""SIGKILL of the builder or the runner at random moments, 20 times: `testbed clean` removes all of it.

Half the kills hit `testbed net up` (userspace impairment: detached daemons, so there is more
to find), half hit `testbed run` (trainers, samplers, the parameter server, all in hosts).  The
moments are drawn from a seeded generator (printed), so a failing draw can be replayed with
``TESTBED_SIGKILL_SEED``.  After each: `testbed clean` as its own process, then nothing with the
testbed's names or mark may remain (namespaces, links, bridges, cgroups, processes, the state
directory), and the decoys (a namespace and bridges of other names) must be untouched.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed.network import cleanup, naming
from tests.conftest import REPO, cli_env
from tests.network.test_cleanup import _decoys_alive, decoys  # noqa: F401 - the fixture

pytestmark = [pytest.mark.root, pytest.mark.slow]

KILLS = 20
SPEC = {"name": "kill", "topology": {"name": "kill", "dcs": [{"name": "a", "hosts": 2, "cpu": 0.5},
                                                              {"name": "b", "hosts": 1, "memory": "1GiB"}],
                                     "links": [{"a": "a", "b": "b", "rate": "50Mbit", "delay": "5ms"}], "ps": "a"},
        "impairment": "auto", "allow_missing_netem": True, "timeout": "60s",
        "training": {"workload": {"name": "digits"}, "stop": {"steps": 30}},
        "schemes": ["asp"], "collectors": {"rate_hz": 10, "trace": False}}


def _everything() -> dict[str, list[str]]:
    left = cleanup.leftovers()
    if Path(naming.STATE_DIR).exists():
        left["state"] = [naming.STATE_DIR]
    return left


def test_sigkill_at_random_moments_then_clean_leaves_nothing(tmp_path: Path, decoys) -> None:  # noqa: F811
    from traffic_control.userspace import available

    assert not _everything(), "a testbed network is already up"
    seed = int(os.environ.get("TESTBED_SIGKILL_SEED", "12"))
    rng = random.Random(seed)
    spec = tmp_path / "kill.yaml"
    spec.write_text(yaml.safe_dump(dict(SPEC, results_dir=str(tmp_path / "results"))))
    impairment = "userspace" if available()[0] else "none"
    commands = {"net up": ["net", "up", "geo_wan", "--impairment", impairment, "--allow-missing-netem"],
                "run": ["run", str(spec)]}
    # Where each spends its time here (net up of geo_wan: ~0.5-3 s building; run: ~1-13 s network
    # and training, then the report), so that most moments hit something half-built or running.
    windows = {"net up": (0.3, 3.0), "run": (1.0, 13.0)}
    found_something = 0
    for i in range(KILLS):
        what = "net up" if i % 2 == 0 else "run"
        moment = rng.uniform(*windows[what])
        p = subprocess.Popen([sys.executable, "-m", "testbed.cli", *commands[what]], cwd=REPO, env=cli_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            p.wait(timeout=moment)
            ended = True  # finished before the kill (a net up leaves its network: that must go too)
        except subprocess.TimeoutExpired:
            ended = False
            p.send_signal(signal.SIGKILL)
            p.wait()
        p.stderr.close()
        before = _everything()
        found_something += bool(before)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "testbed.cli", "clean"], cwd=REPO, env=cli_env(),
                           capture_output=True, text=True, timeout=180)
        took = time.monotonic() - t0
        after = _everything()
        print(f"MEASURED SIGKILL {i + 1}/{KILLS} (seed {seed}): {what} at {moment:.2f} s"
              f"{' (had exited)' if ended else ''}: {sum(map(len, before.values()))} objects, "
              f"clean took {took:.1f} s, left behind {sum(map(len, after.values()))}")
        assert r.returncode == 0, r.stderr
        assert after == {}, f"kill {i + 1} ({what} at {moment:.2f} s, seed {seed}): {after}"
        assert _decoys_alive()
    assert found_something >= KILLS // 3, "the kills hardly ever left anything: the moments prove nothing"
