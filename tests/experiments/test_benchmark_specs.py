"""Every experiment and sweep shipped under benchmarks/ validates as it is written (a campaign spec
that only fails when a user starts it, hours into a sweep, is a defect)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.experiments.spec import load_experiment
from testbed.experiments.sweep import expand
from topologies.loader import read_mapping

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SPECS = sorted(p for p in BENCH.rglob("*.yaml"))


def test_the_claims_campaign_is_shipped():
    names = {p.relative_to(BENCH).as_posix() for p in SPECS}
    assert {"claims/gsyn_straggler.yaml", "claims/gsyn_straggler_sweep.yaml", "claims/gsyn_groups_sweep.yaml",
            "claims/gsyn_groups_calibration.yaml", "claims/pgcs_ratio.yaml", "claims/pgcs_ratio_sweep.yaml",
            "claims/gsyn_ps_placement_sweep.yaml", "claims/pgcs_ratio_accel.yaml",
            "claims/pgcs_ratio_accel_sweep.yaml", "claims/pgcs_ratio_real.yaml", "claims/pgcs_ratio_real_sweep.yaml",
            "claims/pgcs_ratio_real_calibration.yaml", "claims/gsyn_straggler_4dc_sweep.yaml"} <= names


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.relative_to(BENCH).as_posix())
def test_benchmark_spec_validates(path: Path):
    data = read_mapping(path)
    if "grid" in data:
        name, points = expand(data, str(path))
        assert points, name
    else:
        spec = load_experiment(str(path))
        assert spec.schemes
