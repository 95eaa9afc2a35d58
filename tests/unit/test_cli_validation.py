"""Bad specs through the CLI: exit status 2, a message naming the field, nothing created."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import run_cli, tb_objects
from tests.unit.test_topology import BAD, GOOD

# A representative subset of issue 2's cases (the model tests cover all of them).
CLI_CASES = [b for b in BAD if b[0] in {
    "unknown-top-key", "unknown-link-key", "negative-rate", "zero-rate", "loss-above-100", "jitter-without-delay",
    "disconnected", "duplicate-dc", "overlong-name", "link-to-missing-dc", "unparseable-delay"}]


def _objects():
    try:
        return tb_objects()
    except Exception:  # reading links needs no root; anything else is not our concern here
        return {}


@pytest.mark.parametrize("spec,field", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_net_up_bad_spec_exits_2_and_creates_nothing(spec, field, write_topology):
    path = write_topology(spec, "bad.yaml")
    before = _objects()
    r = run_cli("net", "up", str(path))
    assert r.returncode == 2, r.stderr
    assert field in r.stderr, r.stderr
    assert "fix:" in r.stderr
    assert "Traceback" not in r.stderr
    assert _objects() == before


def test_other_commands_reject_bad_specs_too(write_topology):
    spec = dict(GOOD, links=[{"a": "east", "b": "west", "rate": "0"}, GOOD["links"][1]])
    path = write_topology(spec, "bad.json")
    for args in (["net", "up", "--dry-run"], ["net", "verify"], ["topo"]):
        r = run_cli(*args, str(path))
        assert r.returncode == 2 and "links[0].rate" in r.stderr, (args, r.stderr)


def test_yaml_syntax_error_exits_2(write_topology):
    path = write_topology("name: x\ndcs: [a, b\n", "broken.yaml")
    r = run_cli("net", "up", str(path))
    assert r.returncode == 2 and "broken.yaml" in r.stderr


def test_topo_prints_normalised_spec():
    r = run_cli("topo", "three_dc_triangle", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["name"] == "three_dc_triangle" and len(d["links"]) == 3
    r = run_cli("topo", "geo_wan")
    assert r.returncode == 0
    assert yaml.safe_load(r.stdout)["scale"] == pytest.approx(0.1)


def test_the_cli_starts_without_numeric_libraries():
    """Every `testbed` command builds the whole parser; under the kernel lab's TCG each heavy import
    costs tens of seconds (numpy at start-up made `net set`/`net exec` there miss their 60-120 s
    test timeouts), so loading the subcommands must not import numpy, scipy, torch or pandas."""
    import json
    import subprocess
    import sys

    code = ("import json, sys, testbed.cli as c; c.build_parser(); "
            "print(json.dumps({m: m in sys.modules for m in ('numpy', 'scipy', 'torch', 'pandas', 'matplotlib')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert not any(loaded.values()), loaded
