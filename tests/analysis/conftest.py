"""Shared record directories for the analysis tests (written once per session)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.analysis import style
from tests.analysis.fakes import write_run


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean run: every scheme, two repetitions, 4 workers in 2 DCs."""
    return write_run(tmp_path_factory.mktemp("clean") / "exp" / "run1", reps=2, steps=12)


@pytest.fixture(scope="session")
def sweep_experiment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An experiment sweeping Gsyn's group count over three runs, with a predicted optimum."""
    exp = tmp_path_factory.mktemp("sweep") / "gsyn-groups"
    for g in (1, 2, 4):
        write_run(exp / f"g{g}", schemes=("gsyn", "bsp-ring"), reps=2, steps=8, groups=g,
                  wan_ms=30.0 + 10 * abs(g - 2),
                  manifest={"sweep": {"groups": g}, "predicted_optimum": {"groups": {"gsyn": 2}}})
    return exp


@pytest.fixture()
def layout_log() -> list[str]:
    """Collect layout problems (overlapping or cut-off text) of every figure saved in a test."""
    log: list[str] = []
    style.LAYOUT_LOG = log
    yield log
    style.LAYOUT_LOG = None


def write_json(path: Path, obj: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
