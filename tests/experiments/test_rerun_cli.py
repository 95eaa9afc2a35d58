"""`testbed run --json` then `testbed rerun RUN_DIR --json`, as a user runs them under sudo:
separate processes, a real network, results owned by the user behind sudo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.network.cleanup import leftovers

pytestmark = [pytest.mark.root, pytest.mark.torch, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

REPO = Path(__file__).resolve().parents[2]
USER = (65534, 65534)  # nobody: stands in for the user who typed sudo


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SUDO_UID=str(USER[0]), SUDO_GID=str(USER[1]), SUDO_USER="nobody")
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=400)


def test_run_then_rerun_from_the_manifest_alone(tmp_path: Path) -> None:
    topo = tmp_path / "topo.yaml"
    topo.write_text(yaml.safe_dump({"name": "rr", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
                                    "links": [{"a": "a", "b": "b", "rate": "50Mbit"}]}))
    spec = tmp_path / "exp.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "rr", "topology": "topo.yaml", "impairment": "none", "timeout": "90s", "seed": 7,
        "training": {"workload": {"name": "synthetic", "grad_bytes": "4KiB", "compute_s": "1ms"},
                     "stop": {"steps": 4}, "eval_every": 2},
        "schemes": [{"label": "bsp", "scheme": {"name": "bsp"}}],
        "collectors": {"links": False, "procs": False, "trace": False}}))
    results = tmp_path / "results"
    r = _cli("run", str(spec), "--results", str(results), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout)
    assert [t["status"] for t in first["trials"]] == ["ok"]
    run1 = Path(first["results"])
    m1 = json.loads((run1 / "manifest.json").read_text())
    assert m1["provenance"]["git"]["commit"] and m1["provenance"]["capabilities"]["htb"]["ok"] is True
    assert m1["resolved_spec"]["topology"]["links"][0]["rate"] == "50Mbit"
    # everything the run wrote belongs to the user behind sudo, from results/ down
    for p in [results, *results.rglob("*")]:
        assert os.lstat(p).st_uid == USER[0], p
    # the topology file changes after the run: the rerun must still build the original network
    topo.write_text(yaml.safe_dump({"name": "rr", "dcs": ["a", "b"], "links": [{"a": "a", "b": "b",
                                                                               "rate": "1Mbit"}]}))
    topo.unlink()
    r = _cli("rerun", str(run1), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"rerun of {run1}" in r.stderr
    second = json.loads(r.stdout)
    run2 = Path(second["results"])
    assert run2 != run1 and run2.parent == run1.parent  # beside the original
    m2 = json.loads((run2 / "manifest.json").read_text())
    assert m2["spec_hash"] == m1["spec_hash"] and m2["rerun_of"] == str(run1.resolve())
    t1 = json.loads((run1 / "trials" / "bsp-r0" / "manifest.json").read_text())
    t2 = json.loads((run2 / "trials" / "bsp-r0" / "manifest.json").read_text())
    assert t1["seed"] == t2["seed"] == 7 and t1["topology"] == t2["topology"]
    assert t2["tc_state"] and os.lstat(run2).st_uid == USER[0]
    # nothing differs between two runs a minute apart on one machine
    assert m2["rerun_differences"] == [] or all("uncommitted" in d for d in m2["rerun_differences"])
    r = _cli("report", str(run1.parent), "--json", "--no-trace")
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(r.stdout)
    assert rep["warnings"] == [] and rep["summary"][0]["trials"] == 2  # same spec: pooled without a warning
    assert leftovers() == {}
