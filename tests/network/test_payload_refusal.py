"""The userspace backend refuses duplication and corruption from the command line, before building.

Its daemons hold packet ids and give verdicts; they never see a payload, so
they cannot send a packet twice or flip its bits (netem can: ``tests/netem/
test_netem_payload.py`` in the kernel lab).  A spec asking for either under
the userspace backend must exit 2 naming the field and the fix, with nothing
left behind, never run with the field silently ignored.
"""

from __future__ import annotations

import pytest
import yaml

from testbed.network import cleanup
from tests.conftest import run_cli
from tests.network.helpers import require_root_tools

pytestmark = pytest.mark.root

SPEC = {"name": "payload", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
        "links": [{"a": "a", "b": "b", "rate": "100Mbit", "delay": "2ms", "reverse": {"corrupt": "1%"}}]}


@pytest.mark.parametrize("dry", [False, True], ids=["up", "dry-run"])
def test_userspace_refuses_corrupt_with_the_field_and_exit_2(tmp_path, dry):
    require_root_tools()
    f = tmp_path / "payload.yaml"
    f.write_text(yaml.safe_dump(SPEC))
    r = run_cli("net", "up", str(f), "--impairment", "userspace", *(["--dry-run"] if dry else []), timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert "links[0].reverse.corrupt" in r.stderr and "netem" in r.stderr, r.stderr
    assert cleanup.leftovers() == {}
