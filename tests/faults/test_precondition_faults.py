"""What would make every trial fail is found before the first one is built: exit 2 with the fix.

Before, a non-root `testbed run` built every trial and failed each; a network already up made
each trial fail; `--repetitions 0` was accepted silently.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from testbed.network import cleanup
from tests.conftest import REPO, cli_env, run_cli
from tests.network.helpers import require_root_tools

pytestmark = pytest.mark.root

SPEC = {"name": "pre", "topology": {"name": "pre", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                                    "links": [{"a": "a", "b": "b", "rate": "50Mbit"}]},
        "impairment": "none", "training": {"workload": {"name": "digits"}, "stop": {"steps": 5}},
        "schemes": ["bsp"]}


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    p = tmp_path / "pre.yaml"
    p.write_text(yaml.safe_dump(dict(SPEC, results_dir=str(tmp_path / "results"))))
    return p


@pytest.fixture
def readable_dir():
    """A directory a normal user can read (pytest's tmp_path is root's only)."""
    d = Path(tempfile.mkdtemp(prefix="tb-pre-test-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_run_as_a_normal_user_stops_before_building(readable_dir):
    require_root_tools()
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux)")
    spec_file = readable_dir / "pre.yaml"
    spec_file.write_text(yaml.safe_dump(dict(SPEC, results_dir=str(readable_dir / "results"))))
    spec_file.chmod(0o644)
    tmp_path = readable_dir
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                        "testbed.cli", "run", str(spec_file)], cwd=REPO, env=cli_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "root" in r.stderr and "sudo" in r.stderr
    assert not (tmp_path / "results").exists(), "nothing is created before the checks pass"


def test_run_and_sweep_refuse_while_a_network_is_up(spec_file, tmp_path):
    require_root_tools()
    assert not cleanup.owned_netns(), "a testbed network is already up"
    r = run_cli("net", "up", "two_dc", "--impairment", "none", "--allow-missing-netem", timeout=120)
    assert r.returncode == 0, r.stderr
    try:
        r = run_cli("run", str(spec_file), timeout=120)
        assert r.returncode == 2 and "already up" in r.stderr, r.stderr
        assert not (tmp_path / "results").exists()
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(yaml.safe_dump({"name": "presweep", "experiment": str(spec_file),
                                         "grid": {"wan.rate": ["10Mbit", "20Mbit"]},
                                         "results_dir": str(tmp_path / "results")}))
        r = run_cli("sweep", str(sweep), timeout=120)
        assert r.returncode == 2 and "already up" in r.stderr, r.stderr
        assert not (tmp_path / "results").exists()
    finally:
        run_cli("net", "down", timeout=120)
    assert cleanup.leftovers() == {}


@pytest.mark.parametrize("n", ["0", "-1"])
def test_repetitions_below_one_are_rejected(spec_file, n):
    r = run_cli("run", str(spec_file), "--repetitions", n, timeout=120)
    assert r.returncode == 2 and "--repetitions" in r.stderr, r.stderr


@pytest.fixture
def path_without_iptables(tmp_path: Path) -> dict[str, str]:
    """A PATH with every program of this one except iptables (a machine without the package)."""
    import os

    shim = tmp_path / "bin"
    shim.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            src = os.path.join(d, name)
            if name.startswith(("iptables", "ip6tables", "xtables")) or (shim / name).exists():
                continue
            if os.access(src, os.X_OK) and not os.path.isdir(src):
                (shim / name).symlink_to(src)
    env = cli_env()
    env["PATH"] = str(shim)
    return env


def test_run_without_iptables_stops_before_building_naming_it(spec_file, path_without_iptables, tmp_path):
    require_root_tools()
    assert not cleanup.owned_netns(), "a testbed network is already up"
    raw = yaml.safe_load(spec_file.read_text())
    raw["impairment"] = "userspace"
    spec_file.write_text(yaml.safe_dump(raw))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(spec_file)], cwd=REPO,
                       env=path_without_iptables, capture_output=True, text=True, timeout=120)
    print(f"MEASURED fault iptables missing: exit {r.returncode}: {r.stderr.strip()[-200:]}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "iptables" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "results").exists()
    assert cleanup.leftovers() == {}
