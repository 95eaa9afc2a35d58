"""Experiment and sweep specs: validation names the field, exit status 2, nothing created."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.experiments.spec import load_experiment, parse_experiment
from testbed.experiments.sweep import expand, point_id, select_points
from traffic_control.errors import ValidationError

BASE = {
    "name": "t",
    "topology": "two_dc",
    "training": {"workload": {"name": "digits"}, "stop": {"steps": 5}},
    "schemes": ["bsp", {"label": "g", "scheme": {"name": "gsyn"}}],
}


def test_bundled_demo_specs_validate() -> None:
    for name in ("demo", "demo_reduced"):
        spec = load_experiment(name)
        assert spec.topology.name == "three_dc_triangle"
        assert len(spec.schemes) >= 4
        labels = [s.label for s in spec.schemes]
        assert len(set(labels)) == len(labels)


def test_scheme_shorthand_and_overrides() -> None:
    d = dict(BASE, schemes=["bsp", {"label": "s2", "scheme": {"name": "ssp", "staleness": 2},
                                    "training": {"stop": {"steps": 9}}}])
    spec = parse_experiment(d)
    assert [s.label for s in spec.schemes] == ["bsp", "s2"]
    assert spec.schemes[1].training["stop"]["steps"] == 9
    assert spec.schemes[0].training["stop"]["steps"] == 5


@pytest.mark.parametrize("change, field", [
    ({"bogus": 1}, "bogus"),
    ({"topology": "nowhere"}, "topology"),
    ({"repetitions": 0}, "repetitions"),
    ({"impairment": "magic"}, "impairment"),
    ({"schemes": ["nosuchscheme"]}, "schemes[0]"),
    ({"schemes": ["bsp", "bsp"]}, "schemes[1].label"),
    ({"collectors": {"rate_hz": -1}}, "collectors.rate_hz"),
    ({"schemes": [{"label": "g", "scheme": {"name": "ssp", "staleness": -1}}]}, "schemes[0]"),
    ({"schemes": [{"label": "g", "scheme": {"name": "gsyn", "groups": 99}}]}, "schemes[0]"),
])
def test_bad_experiment_names_field(change: dict, field: str) -> None:
    with pytest.raises(ValidationError) as e:
        parse_experiment({**BASE, **change})
    assert e.value.field.startswith(field), e.value


def test_bad_spec_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**BASE, "schemes": [{"label": "x", "scheme": {"name": "gsyn", "groups": 99}}]}))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(bad), "--results", str(tmp_path / "res")],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "schemes[0]" in r.stderr
    assert not (tmp_path / "res").exists()


def test_sweep_expands_grid_and_validates_points(tmp_path: Path) -> None:
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(BASE))
    sweep = {"name": "sw", "experiment": "exp.yaml", "repetitions": 2,
             "grid": {"wan.rate": ["10Mbit", "20Mbit"], "wan.delay": ["1ms", "5ms"], "seed": [1, 2]}}
    name, points = expand(sweep, str(tmp_path / "sweep.yaml"))
    assert name == "sw" and len(points) == 8
    ids = {point_id(p) for p, _ in points}
    assert len(ids) == 8
    spec = parse_experiment(points[0][1], str(tmp_path / "exp.yaml"))
    assert spec.repetitions == 2
    assert all(lk.forward.rate_bps == 10e6 for lk in spec.topology.links)
    with pytest.raises(ValidationError) as e:
        expand({**sweep, "grid": {"wan.colour": ["red"]}}, str(tmp_path / "sweep.yaml"))
    assert e.value.field == "grid.wan.colour"


def test_resuming_a_sweep_whose_experiment_changed_is_refused(tmp_path: Path) -> None:
    """A finished point run under another base experiment (a target or lr edited since) is never
    skipped as "done" and pooled with new points: the CLI exits 2 naming the fix, nothing runs."""
    from testbed.experiments.sweep import experiment_hash

    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(BASE))
    sweep = {"name": "sw", "experiment": "exp.yaml", "grid": {"seed": [1, 2]}}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    _, points = expand(sweep, str(tmp_path / "sweep.yaml"))
    out = tmp_path / "out"
    for k, (point, exp) in enumerate(points):  # point 1 ran this spec, point 2 an older one
        d = out / "points" / point_id(point)
        d.mkdir(parents=True)
        h = experiment_hash(exp) if k == 0 else experiment_hash({**exp, "timeout": "999s"})
        (d / "done.json").write_text(json.dumps({"point": point, "experiment_hash": h}))
    before = sorted(p.name for p in out.rglob("*"))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "sweep", str(tmp_path / "sweep.yaml"), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "ran a different experiment" in r.stderr and point_id(points[1][0]) in r.stderr
    assert "--out" in r.stderr  # the fix
    assert sorted(p.name for p in out.rglob("*")) == before  # nothing ran, nothing written


def test_a_sweep_moves_the_parameter_server_of_a_named_topology(tmp_path: Path) -> None:
    """``topology.ps`` on a bundled topology: each point gets the topology inlined with its PS placement."""
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump({**BASE, "topology": "three_dc_triangle"}))
    sweep = {"name": "ps", "experiment": "exp.yaml", "grid": {"topology.ps": ["east", "west"]}}
    _, points = expand(sweep, str(tmp_path / "sweep.yaml"))
    specs = [parse_experiment(exp, str(tmp_path / "exp.yaml")) for _, exp in points]
    assert [s.topology.ps for s in specs] == ["east", "west"]
    assert {s.topology.name for s in specs} == {"three_dc_triangle"}
    with pytest.raises(ValidationError):
        expand({**sweep, "grid": {"topology.ps": ["nowhere"]}}, str(tmp_path / "sweep.yaml"))


def test_sweep_only_picks_points_by_grid_value_and_keeps_their_ids(tmp_path: Path) -> None:
    """``sweep --only KEY=VALUE``: numbers as YAML reads them, a scheme entry by its label, a key named
    twice keeps either value; the kept points are the whole sweep's (same ids, so it resumes past them)."""
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(BASE))
    schemes = [[{"label": "a1", "scheme": {"name": "asp"}}], [{"label": "g1", "scheme": {"name": "gsyn"}}], ["bsp"]]
    sweep = {"name": "sw", "experiment": "exp.yaml", "grid": {"seed": [1, 2, 3], "schemes": schemes}}
    _, points = expand(sweep, str(tmp_path / "sweep.yaml"))
    grid = sweep["grid"]

    def kept(*only: str) -> list[tuple[int, str]]:
        return [(p["seed"], p["schemes"][0] if isinstance(p["schemes"][0], str) else p["schemes"][0]["label"])
                for p, _ in select_points(grid, points, list(only))]

    assert kept("seed=2") == [(2, "a1"), (2, "g1"), (2, "bsp")]
    assert kept("schemes=g1") == [(1, "g1"), (2, "g1"), (3, "g1")]
    assert kept("schemes=bsp", "seed=3") == [(3, "bsp")]
    assert kept("seed=1", "seed=3", "schemes=a1") == [(1, "a1"), (3, "a1")]
    ids = {point_id(p) for p, _ in points}
    assert {point_id(p) for p, _ in select_points(grid, points, ["seed=2"])} <= ids
    for bad, says in (("colour=red", "use one of: seed, schemes"), ("seed=9", "use one of: 1, 2, 3"),
                      ("schemes=zz", "use one of: a1, g1, bsp"), ("seed", "KEY=VALUE")):
        with pytest.raises(ValidationError) as e:
            select_points(grid, points, [bad])
        assert e.value.field == "--only" and says in str(e.value), e.value


def test_sweep_only_with_a_value_no_point_has_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({"name": "sw", "experiment": "exp.yaml",
                                                         "grid": {"seed": [1, 2]}}))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "sweep", str(tmp_path / "sweep.yaml"), "--out", str(out),
                        "--only", "seed=7"], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "--only" in r.stderr and "seed has no value '7'" in r.stderr and "use one of: 1, 2" in r.stderr
    assert not out.exists()


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_extends_merges_mappings_and_replaces_lists(tmp_path: Path) -> None:
    """``extends:``: the child changes one field of a base file; mappings merge key by key, lists (schemes)
    and scheme sections replace; the base's name is never inherited (a child would write into its folder)."""
    base = {**BASE, "name": "base_run", "seed": 15, "training": {
        "workload": {"name": "digits"}, "stop": {"steps": 5},
        "optimizer": {"name": "sgd", "lr": 0.1, "lr_rule": "linear"},
        "compute": {"mode": "emulated", "profile": "resnet50-a100-tf32", "factor_by_dc": {"west": 3.0}}},
        "lr_search": {"seed": 1015, "schemes": ["bsp", "g"]}}
    _write(tmp_path / "base.yaml", base)
    child = _write(tmp_path / "west15.yaml", {
        "extends": "base.yaml", "training": {"compute": {"factor_by_dc": {"west": 1.5}}, "optimizer": {"lr": 0.3}},
        "lr_search": {"schemes": ["g"]}, "schemes": ["bsp", {"label": "g", "scheme": {"name": "gsyn", "groups": 2}}]})
    spec = load_experiment(str(child))
    assert spec.name == "west15"  # its own file's name, not base_run
    assert spec.seed == 15 and spec.topology.name == "two_dc"
    tr = spec.schemes[1].training
    assert tr["compute"]["factor_by_dc"] == {"west": 1.5} and tr["compute"]["profile"] == "resnet50-a100-tf32"
    assert tr["optimizer"] == {"name": "sgd", "lr": 0.3, "lr_rule": "linear"}
    assert tr["stop"] == {"steps": 5} and tr["scheme"] == {"name": "gsyn", "groups": 2}
    assert spec.lr_search is not None and [s for s in spec.lr_search.schemes] == ["g"]
    assert "extends" not in spec.raw and spec.raw["lr_search"]["seed"] == 1015  # what a run records
    assert load_experiment(str(tmp_path / "base.yaml")).name == "base_run"  # the base itself is untouched
    named = _write(tmp_path / "named.yaml", {"extends": "west15.yaml", "name": "mine"})  # a chain of two
    assert load_experiment(str(named)).name == "mine"
    assert load_experiment(str(named)).schemes[1].training["compute"]["factor_by_dc"] == {"west": 1.5}


def test_extends_finds_the_base_files_own_topology_from_another_folder(tmp_path: Path) -> None:
    topo = Path(__file__).resolve().parents[2] / "topologies" / "two_dc.yaml"
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "my_topo.yaml").write_text(topo.read_text())
    _write(tmp_path / "base" / "exp.yaml", {**BASE, "topology": "my_topo.yaml"})
    child = _write(tmp_path / "elsewhere" / "child.yaml", {"extends": "../base/exp.yaml", "repetitions": 3})
    spec = load_experiment(str(child))
    assert spec.repetitions == 3 and spec.topology.dc_names == load_experiment(str(tmp_path / "base" / "exp.yaml")).topology.dc_names
    assert Path(spec.raw["topology"]).is_absolute()  # rewritten: relative to the child it would not be found


@pytest.mark.parametrize("files, problem", [
    ({"child.yaml": {"extends": "nowhere.yaml"}}, "no experiment file 'nowhere.yaml'"),
    ({"child.yaml": {"extends": "a.yaml"}, "a.yaml": {"extends": "child.yaml"}}, "a cycle: child.yaml -> a.yaml -> child.yaml"),
    ({"child.yaml": {"extends": "child.yaml"}}, "a cycle"),
    ({"child.yaml": {"extends": 3}}, "expected a file path"),
    ({"child.yaml": {"extends": "a.yaml"}, "a.yaml": {"extends": "gone.yaml"}}, "no experiment file 'gone.yaml'"),
])
def test_a_bad_extends_names_the_field(tmp_path: Path, files: dict, problem: str) -> None:
    for name, data in files.items():
        _write(tmp_path / name, {**BASE, **data})
    with pytest.raises(ValidationError) as e:
        load_experiment(str(tmp_path / "child.yaml"))
    assert e.value.field.startswith("extends") and problem in e.value.problem, e.value


def test_an_unresolved_extends_is_refused() -> None:
    with pytest.raises(ValidationError) as e:
        parse_experiment({**BASE, "extends": "base.yaml"})
    assert e.value.field == "extends" and "load_experiment" in e.value.fix


def test_extends_from_the_command_line_and_in_a_sweep(tmp_path: Path) -> None:
    """As users run it: a missing base is exit 2 naming extends, nothing made; a sweep's experiment may
    extend a file, and an edit of that base changes the points' hash (a resumed sweep refuses them)."""
    from testbed.experiments.sweep import experiment_hash

    child = _write(tmp_path / "child.yaml", {"extends": "base.yaml", "repetitions": 2})
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(child), "--results", str(tmp_path / "res")],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "extends" in r.stderr and "base.yaml" in r.stderr
    assert not (tmp_path / "res").exists()
    _write(tmp_path / "base.yaml", BASE)
    sweep = {"name": "sw", "experiment": "child.yaml", "grid": {"seed": [1, 2]}}
    _, points = expand(sweep, str(tmp_path / "sweep.yaml"))
    assert [exp["repetitions"] for _, exp in points] == [2, 2] and points[0][1]["topology"] == "two_dc"
    inline = {"name": "sw", "experiment": {"extends": "base.yaml", "seed": 7}, "grid": {"repetitions": [1]}}
    assert expand(inline, str(tmp_path / "sweep.yaml"))[1][0][1]["seed"] == 7
    _write(tmp_path / "base.yaml", {**BASE, "timeout": "99s"})
    _, edited = expand(sweep, str(tmp_path / "sweep.yaml"))
    assert experiment_hash(edited[0][1]) != experiment_hash(points[0][1])


def test_a_sweep_finds_its_base_experiments_own_topology_from_another_folder(tmp_path: Path) -> None:
    """The runner parses every point with the sweep file as its source; a base experiment in another
    folder naming a topology file beside itself must still find it there (it used to validate and
    then fail to load at run time)."""
    topo = Path(__file__).resolve().parents[2] / "topologies" / "two_dc.yaml"
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "my_topo.yaml").write_text(topo.read_text())
    _write(tmp_path / "base" / "exp.yaml", {**BASE, "topology": "my_topo.yaml"})
    sweep_file = _write(tmp_path / "sweeps" / "sw.yaml", {})  # its folder exists, as a real sweep's does
    _, points = expand({"name": "sw", "experiment": "../base/exp.yaml", "grid": {"seed": [1, 2]}}, str(sweep_file))
    specs = [parse_experiment(exp, source=str(sweep_file)) for _, exp in points]  # as the runner does
    assert [s.seed for s in specs] == [1, 2]
    assert all(s.topology.dc_names == load_experiment(str(tmp_path / "base" / "exp.yaml")).topology.dc_names for s in specs)
