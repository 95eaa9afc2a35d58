"""What a record says about itself: provenance, a self-contained spec for rerun, sweep values,
pooling warnings, results owned by the sudo user, --version and --json (no network needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import ownership, provenance
from testbed.analysis import cli as report_cli
from testbed.analysis.report import pooling_warnings
from testbed.experiments.spec import load_experiment, parse_experiment
from testbed.experiments.sweep import expand, sweep_values
from tests.analysis.fakes import write_run
from traffic_control.errors import ValidationError

REPO = Path(__file__).resolve().parents[2]
BASE = {"name": "t", "topology": "two_dc", "training": {"workload": {"name": "digits"}, "stop": {"steps": 5}},
        "schemes": ["bsp"]}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "testbed.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env=env)


# -- provenance ---------------------------------------------------------------------------------------
def test_provenance_names_this_checkout() -> None:
    p = provenance.provenance()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert p["git"]["commit"] == head
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    assert p["git"]["dirty"] is dirty
    assert p["record_format"] == provenance.RECORD_FORMAT and p["kernel"] == os.uname().release
    assert p["software"]["torch"] != "missing" and p["testbed_version"] != "0+unknown"


def test_dirty_tree_is_flagged(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    assert provenance.git_state(tmp_path)["dirty"] is False
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert provenance.git_state(tmp_path)["dirty"] is False
    (tmp_path / "a.py").write_text("x = 2\n")
    st = provenance.git_state(tmp_path)
    assert st["dirty"] is True and st["changed_files"] == ["a.py"]
    assert provenance.git_state(tmp_path / "not-a-repo") is None


def test_differences_name_what_changed() -> None:
    then = {"record_format": 2, "testbed_version": "0.1.0", "git": {"commit": "aaa", "dirty": False},
            "software": {"torch": "2.12.0", "python": "3.11.2"}, "kernel": "6.1",
            "capabilities": {"netem": {"ok": True}, "htb": {"ok": True}}}
    now = {"record_format": 2, "testbed_version": "0.1.0", "git": {"commit": "bbb", "dirty": True},
           "software": {"torch": "2.13.0", "python": "3.11.2"}, "kernel": "6.1",
           "capabilities": {"netem": {"ok": False}, "htb": {"ok": True}}}
    lines = provenance.differences(then, now)
    assert any(line.startswith("git commit: aaa then, bbb now") for line in lines)
    assert any("uncommitted changes" in line for line in lines)
    assert "torch: 2.12.0 then, 2.13.0 now" in lines
    assert "capability netem: yes then, no now" in lines
    assert not any("python" in line or "kernel" in line or "htb" in line for line in lines)
    assert provenance.differences(then, then) == []


def test_version_flag() -> None:
    r = _cli("--version")
    assert r.returncode == 0, r.stderr
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert r.stdout.startswith("testbed ") and head[:12] in r.stdout and "record format" in r.stdout


# -- a spec that reruns from the manifest alone -------------------------------------------------------
@pytest.mark.parametrize("name", ["demo", "demo_reduced"])
def test_resolved_spec_reruns_to_the_same_experiment(name: str) -> None:
    spec = load_experiment(name)
    again = parse_experiment(json.loads(json.dumps(spec.resolved())), source="manifest.json")
    assert again.topology == spec.topology and again.spec_hash == spec.spec_hash
    assert [s.training for s in again.schemes] == [s.training for s in spec.schemes]
    assert (again.seed, again.repetitions, again.timeout_s) == (spec.seed, spec.repetitions, spec.timeout_s)


def test_spec_hash_follows_the_network_not_the_bookkeeping() -> None:
    spec = parse_experiment(dict(BASE))
    assert parse_experiment(dict(BASE, repetitions=5, results_dir="/elsewhere")).spec_hash == spec.spec_hash
    assert parse_experiment(dict(BASE, scale=0.5)).spec_hash != spec.spec_hash  # other rates
    inline = dict(BASE, topology=spec.topology.to_dict())
    assert parse_experiment(inline).spec_hash == spec.spec_hash  # a name and its content are the same spec
    inline["topology"]["links"][0]["rate"] = "1Mbit"
    assert parse_experiment(inline).spec_hash != spec.spec_hash  # an edited topology file is not


def test_rerun_refuses_what_it_cannot_rerun(tmp_path: Path) -> None:
    r = _cli("rerun", str(tmp_path))
    assert r.returncode == 2 and "no manifest.json" in r.stderr
    (tmp_path / "manifest.json").write_text(json.dumps({"experiment": "x", "spec": {}}))
    r = _cli("rerun", str(tmp_path))
    assert r.returncode == 2 and "no resolved_spec" in r.stderr and "testbed run SPEC" in r.stderr
    spec = parse_experiment(dict(BASE))
    (tmp_path / "manifest.json").write_text(json.dumps({"resolved_spec": spec.resolved(), "spec_hash": "0" * 16}))
    r = _cli("rerun", str(tmp_path))
    assert r.returncode == 2 and "hashes to" in r.stderr
    assert not any(p.name != "manifest.json" for p in tmp_path.iterdir())  # nothing created


# -- sweeps -------------------------------------------------------------------------------------------
def test_sweep_values_reach_the_manifest_in_si_units() -> None:
    point = {"wan.rate": "20Mbit", "wan.delay": "5ms", "wan.loss": "0.5%", "training.scheme.groups": 2,
             "seed": 3, "schemes": ["bsp"]}
    v = sweep_values(point)
    assert v == {"rate_bps": 20e6, "delay_s": 0.005, "loss_pct": 0.5, "groups": 2, "seed": 3,
                 "schemes": '["bsp"]'}
    # two paths ending alike keep their full names
    assert set(sweep_values({"a.x": 1, "b.x": 2})) == {"a.x", "b.x"}


def test_sweep_metric_key_is_rejected_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as e:
        expand({"experiment": dict(BASE), "grid": {"seed": [1, 2]}, "metric": "throughput"})
    assert e.value.field == "metric" and "unknown key" in e.value.problem


def test_pooling_runs_of_different_specs_warns(tmp_path: Path) -> None:
    runs = [tmp_path / "r1", tmp_path / "r2", tmp_path / "r3"]
    git = {"commit": "c1"}
    ms = [{"spec_hash": "aaa", "provenance": {"git": git}}, {"spec_hash": "aaa", "provenance": {"git": git}},
          {"spec_hash": "bbb", "provenance": {"git": {"commit": "c2"}}}]
    w = pooling_warnings(runs, ms)
    assert len(w) == 2 and "spec aaa: r1, r2; spec bbb: r3" in w[0] and "commit c1" in w[1]
    assert pooling_warnings(runs[:2], ms[:2]) == []
    # sweep points differ by design: only runs of the same point are compared
    swept = [dict(m, sweep={"groups": g}) for m, g in zip(ms, (1, 2, 3), strict=True)]
    assert pooling_warnings(runs, swept) == []


def test_report_json_and_the_pooling_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "exp"
    write_run(exp / "r1", schemes=("bsp-ring", "asp"), reps=2, steps=6, manifest={"spec_hash": "aaa"})
    write_run(exp / "r2", schemes=("bsp-ring", "asp"), reps=2, steps=6, manifest={"spec_hash": "bbb"})
    rc = report_cli.main([str(exp), "--json", "--no-trace"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out)
    assert data["kind"] == "experiment" and data["summary_md"]
    assert {r["scheme"] for r in data["summary"]} == {"bsp-ring", "asp"}
    assert all(r["trials"] == 4 for r in data["summary"])
    assert any("different specs are pooled" in w for w in data["warnings"])
    assert "warning: runs with different specs are pooled" in err
    assert "## Warnings" in (exp / "summary.md").read_text()


# -- results belong to the sudo user ------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_hand_over_changes_only_root_owned_entries_inside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours")
    tree = tmp_path / "results" / "exp" / "run"
    (tree / "trials").mkdir(parents=True)
    (tree / "trials" / "m.json").write_text("{}")
    (tree / "link").symlink_to(outside)
    keep = tree / "someone-elses.txt"
    keep.write_text("x")
    os.chown(keep, 1234, 1234)
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65533")
    assert ownership.invoking_user() == (65534, 65533)
    n = ownership.hand_over([tmp_path / "results"])
    assert n == 6  # results, exp, run, trials, m.json, the link itself
    for p in (tmp_path / "results", tree, tree / "trials", tree / "trials" / "m.json"):
        assert (p.stat().st_uid, p.stat().st_gid) == (65534, 65533)
    assert os.lstat(tree / "link").st_uid == 65534
    assert outside.stat().st_uid == 0  # the link's target is not followed
    assert keep.stat().st_uid == 1234  # not root's: left alone
    monkeypatch.setenv("SUDO_UID", "0")
    assert ownership.invoking_user() is None  # sudo from root: nothing to hand over
    monkeypatch.delenv("SUDO_UID")
    assert ownership.hand_over([tree]) == 0


def test_missing_parents_lists_what_a_command_will_create(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    target = tmp_path / "results" / "exp" / "stamp"
    assert ownership.missing_parents(target) == [target, target.parent]
    assert ownership.missing_parents(tmp_path) == []
