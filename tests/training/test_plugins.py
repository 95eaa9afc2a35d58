"""Schemes and workloads from outside the package: an installed entry point, or a dotted path.

The example package ``examples/plugins`` (local SGD + linear regression) is found
the two ways a user would add it, validated like a built-in, and trained for real
on loopback (processes started by the supervisor resolve the names again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.training.config import validate_training
from testbed.training.schemes import SCHEMES
from traffic_control.errors import ValidationError

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = REPO / "examples" / "plugins"


@pytest.fixture()
def installed(tmp_path: Path) -> str:
    """A site directory holding the example's distribution metadata (what `pip install` writes),
    and PYTHONPATH with it and the package: entry points are discovered from it for real."""
    dist = tmp_path / "site" / "tb_example-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tb-example\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[geo_testbed.schemes]\nlocalsgd = tb_example:SCHEME\n\n"
                                           "[geo_testbed.workloads]\nlinreg = tb_example:WORKLOAD\n")
    return os.pathsep.join([str(tmp_path / "site"), str(PLUGIN_DIR), str(REPO)])


def _py(code: str, pythonpath: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          cwd=REPO)


def test_entry_points_register_names(installed: str) -> None:
    r = _py("from testbed.training.schemes import SCHEMES\n"
            "from testbed.training.workloads import WORKLOADS\n"
            "from testbed.training.config import validate_training\n"
            "print(SCHEMES.names()); print(WORKLOADS.names())\n"
            "t = validate_training({'scheme': {'name': 'localsgd', 'every': 2}, 'workload': 'linreg'})\n"
            "print(type(t.scheme.params).__name__, t.scheme.params.every, t.uses_server)\n", installed)
    assert r.returncode == 0, r.stderr
    schemes, workloads, parsed = r.stdout.splitlines()
    assert "localsgd" in schemes and "bsp" in schemes and "linreg" in workloads
    assert parsed == "LocalSgdParams 2 False"


def test_entry_point_params_are_validated_like_builtins(installed: str) -> None:
    r = _py("from testbed.training.config import validate_training\n"
            "validate_training({'scheme': {'name': 'localsgd', 'every': 0}, 'workload': 'linreg'})\n", installed)
    assert r.returncode != 0 and "training.scheme.every: must be at least 1" in r.stderr
    r = _py("from testbed.training.config import validate_training\n"
            "validate_training({'scheme': {'name': 'localsgd', 'evry': 2}, 'workload': 'linreg'})\n", installed)
    assert "training.scheme.evry: unknown key" in r.stderr


def test_dotted_path_without_installing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    t = validate_training({"scheme": {"name": "tb_example:SCHEME", "every": 3},
                           "workload": {"name": "tb_example:WORKLOAD", "features": 8}})
    assert t.scheme.params.every == 3 and t.workload.params.features == 8
    assert SCHEMES.entry("tb_example:SCHEME").name == "tb_example:SCHEME"


@pytest.mark.parametrize("name,problem", [
    ("nosuch", "unknown scheme 'nosuch'"),
    ("no_such_module_xyz:SCHEME", "cannot load scheme 'no_such_module_xyz:SCHEME': ModuleNotFoundError"),
    ("json:dumps", "is function, not a registry Entry"),
])
def test_bad_external_names_say_what_to_do(name: str, problem: str) -> None:
    with pytest.raises(ValidationError) as e:
        validate_training({"scheme": {"name": name}, "workload": "digits"})
    assert e.value.field == "training.scheme.name" and problem in e.value.problem, e.value


@pytest.mark.torch
def test_plugin_scheme_and_workload_train_for_real(tmp_path: Path, installed: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    for p in reversed(installed.split(os.pathsep)):  # this process validates the spec too
        monkeypatch.syspath_prepend(p)
    from testbed.training.local import run_local
    from tests.training.helpers import load_params

    cfg = {"workload": {"name": "linreg", "features": 8, "batch_size": 16},
           "scheme": {"name": "localsgd", "every": 3}, "stop": {"steps": 12},
           "optimizer": {"name": "sgd", "lr": 0.05}, "eval_every": 1000, "save_model": True}
    res = run_local(cfg, {"a": 1, "b": 1}, tmp_path, timeout_s=150, env=dict(os.environ, PYTHONPATH=installed))
    assert res.ok, res.diagnosis()
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    losses = [float(r.split(",")[2]) for r in rows[1:]]
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0], losses  # it learns
    # models averaged at the last step (12 % 3 == 0): both replicas end identical
    import torch

    assert torch.equal(load_params(tmp_path, "worker", 0), load_params(tmp_path, "worker", 1))
    syncs = [json.loads(line) for f in (tmp_path / "events").glob("*worker*.jsonl")
             for line in f.read_text().splitlines() if '"wan_sync"' in line]
    assert sorted({s["step"] for s in syncs}) == [2, 5, 8, 11]  # every 3 steps, not every step
