"""The per-scheme lr search: grid, pick, separate seed, records, and the real trials' lr (fake trials)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from testbed.experiments.lr_search import (
    DEFAULT_EXPONENTS,
    SEED_OFFSET,
    Row,
    choose,
    load_picks,
    log_spaced,
)
from testbed.experiments.runner import run_experiment
from testbed.experiments.spec import parse_experiment
from testbed.experiments.trial import TrialResult
from traffic_control.errors import ValidationError

BASE = {
    "name": "t",
    "topology": "two_dc",
    "seed": 3,
    "repetitions": 2,
    "training": {"workload": {"name": "digits"}, "optimizer": {"lr": 0.1, "lr_rule": "linear"},
                 "stop": {"steps": 50, "target": {"metric": "loss", "value": 0.5}}},
    "schemes": ["bsp", {"label": "g", "scheme": {"name": "gsyn"}}],
    "collectors": {"links": False, "procs": False, "trace": False},
}

#: the fake's best lr per label (time to target grows with the log-distance from it)
BEST = {"bsp": 0.3, "g": 0.03}


class FakeTrials:
    """Stands in for run_trial: writes metrics.csv and a manifest from a known loss model."""

    def __init__(self, fail: set[float] | None = None) -> None:
        self.calls: list[dict] = []
        self.fail = fail or set()

    def __call__(self, spec, scheme, rep, trial_dir: Path, progress=None, log=None, stop_flag=None, name=None):
        trial_dir.mkdir(parents=True, exist_ok=False)
        lr = scheme.training["optimizer"]["lr"]
        seed = spec.seed + rep
        self.calls.append({"label": scheme.label, "lr": lr, "seed": seed, "dir": trial_dir,
                           "stop": scheme.training["stop"], "provenance": scheme.lr_provenance, "name": name})
        if lr in self.fail:
            return TrialResult(scheme.label, rep, trial_dir, "failed", "diverged")
        dist = abs(math.log10(lr) - math.log10(BEST[scheme.label]))
        reach = dist < 0.9  # far from the best: never reaches the target
        rows = ["step,wall_s,loss,acc,expert,updates"]
        for k in range(6):
            t = (1 + dist) * k
            loss = (2.0 - 0.35 * k) if reach else (2.0 - 0.05 * k - 0.01 * dist)
            rows.append(f"{k * 10},{t:.3f},{loss:.4f},,,{k * 10}")
        (trial_dir / "metrics.csv").write_text("\n".join(rows) + "\n")
        (trial_dir / "manifest.json").write_text(json.dumps({"seed": seed, "lr": {"lr": lr * 2}}))
        return TrialResult(scheme.label, rep, trial_dir, "ok", last={"loss": rows[-1].split(",")[2]})


def _spec(**search):
    return parse_experiment(dict(BASE, lr_search=search))


def test_log_spacing():
    vals = log_spaced(0.001, 1.0, 4)
    assert len(vals) >= 4
    ratios = [b / a for a, b in zip(vals, vals[1:])]
    assert all(r == pytest.approx(10.0, rel=1e-4) for r in ratios)
    spec = _spec(values={"low": 0.01, "high": 1.0, "count": 5})
    v = spec.lr_search.values_for(0.1)
    assert v[0] == pytest.approx(0.01) and v[-1] == pytest.approx(1.0) and len(v) == 5
    default = _spec().lr_search.values_for(0.2)  # around the scheme's own lr, which it includes
    assert len(default) == len(DEFAULT_EXPONENTS) >= 4 and 0.2 in default
    assert all(b / a == pytest.approx(10 ** 0.5, rel=1e-4) for a, b in zip(default, default[1:]))


def test_choose_by_time_then_final_loss_failed_last():
    nan = math.nan
    rows = [Row("x", 0.01, "ok", nan, 0.9), Row("x", 0.1, "ok", 4.0, 0.4), Row("x", 0.3, "ok", 4.0, 0.3),
            Row("x", 1.0, "failed", 1.0, 0.1)]
    assert choose(rows).lr == 0.3  # tie on time: the lower final loss
    assert choose([Row("x", 0.01, "ok", nan, 0.9), Row("x", 0.1, "ok", nan, 0.7)]).lr == 0.1  # none reached
    assert choose([Row("x", 0.01, "ok", nan, nan), Row("x", 0.1, "ok", nan, 0.7)]).lr == 0.1  # NaN loss last
    assert choose([Row("x", 0.1, "failed", nan, nan)]) is None


def test_search_then_trials_with_the_picks(tmp_path):
    spec = _spec(values=[0.01, 0.03, 0.1, 0.3, 1.0], steps=20)
    fake = FakeTrials()
    res = run_experiment(spec, run_dir=tmp_path / "run", report=False, trial_fn=fake)
    search = [c for c in fake.calls if "lr_search" in c["dir"].parts]
    real = [c for c in fake.calls if "trials" in c["dir"].parts]
    assert len(search) == 10 and len(real) == 4 and len(res.trials) == 4
    # a separate seed: none of the repetitions' seeds (3, 4)
    assert {c["seed"] for c in search} == {3 + SEED_OFFSET}
    assert {c["seed"] for c in real} == {3, 4}
    assert all(c["stop"]["steps"] == 20 for c in search) and all(c["stop"]["steps"] == 50 for c in real)
    # the search's trials are named by scheme and lr in their messages (not "trial bsp r0")
    assert [c["name"] for c in search[:2]] == ["lr search bsp lr=0.01", "lr search bsp lr=0.03"]
    assert all(c["name"] is None for c in real)
    run = tmp_path / "run"
    assert (run / "lr_search" / "bsp" / "lr=0.3" / "metrics.csv").is_file()
    # the picks: the fake's best per scheme, used by every real trial and recorded as searched
    for c in real:
        assert c["lr"] == BEST[c["label"]]
        assert c["provenance"]["source"] == "searched"
        assert c["provenance"]["given_lr"] == 0.1
        assert Path(c["provenance"]["search"]) == run / "lr_search" / "lr_search.json"
    record = json.loads((run / "lr_search" / "lr_search.json").read_text())
    assert record["seed"] == 3 + SEED_OFFSET
    assert record["picks"]["bsp"]["lr"] == 0.3 and record["picks"]["g"]["lr"] == 0.03
    bsp = record["schemes"]["bsp"]
    assert bsp["values"] == [0.01, 0.03, 0.1, 0.3, 1.0]
    assert len(bsp["results"]) == 5 and sum(r["picked"] for r in bsp["results"]) == 1
    assert bsp["results"][0]["time_to_target_s"] is None  # 0.01: never reached
    assert bsp["results"][3]["time_to_target_s"] == pytest.approx(5.0)  # 0.3: loss 0.25 <= 0.5 at row 5
    with (run / "lr_search" / "lr_search.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 10 and {r["seed"] for r in rows} == {str(3 + SEED_OFFSET)}
    assert [r["lr"] for r in rows if r["picked"] == "True"] == ["0.3", "0.03"]
    assert json.loads(rows[3]["lr_used"]) == pytest.approx(0.6)  # from the trial manifest's lr record
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["lr_search"]["picks"]["g"]["lr"] == 0.03


def test_a_pick_at_the_end_of_the_grid_is_flagged(tmp_path):
    """The fake's best bsp lr is 0.3; a grid that stops at 0.1 picks its largest value, which is
    no tuned baseline: the pick says so (``at_edge``) and the log says how to extend the grid."""
    spec = _spec(values=[0.003, 0.01, 0.03, 0.1], steps=20)
    said: list[str] = []
    from testbed.experiments.lr_search import run_lr_search

    picks = run_lr_search(spec, tmp_path / "run", FakeTrials(), log=said.append)
    assert picks["bsp"]["lr"] == 0.1 and picks["bsp"]["at_edge"] == "largest"
    assert "at_edge" not in picks["g"]  # g's best, 0.03, lies inside the grid
    warned = [m for m in said if m.startswith("warning:")]
    assert len(warned) == 1 and "bsp" in warned[0] and "extend lr_search.values" in warned[0]
    record = json.loads((tmp_path / "run" / "lr_search" / "lr_search.json").read_text())
    assert record["picks"]["bsp"]["at_edge"] == "largest"


def test_grid_edge():
    from testbed.experiments.lr_search import grid_edge

    assert grid_edge(1.0, [0.1, 0.3, 1.0]) == "largest"
    assert grid_edge(0.1, [0.1, 0.3, 1.0]) == "smallest"
    assert grid_edge(0.3, [0.1, 0.3, 1.0]) is None
    assert grid_edge(1.0, [0.3, 1.0]) is None  # two values: no interior to speak of


def test_skip_and_reuse(tmp_path):
    spec = _spec(values=[0.01, 0.03, 0.1, 0.3], schemes=["g"])
    first = FakeTrials()
    run_experiment(spec, run_dir=tmp_path / "a", report=False, trial_fn=first)
    assert {c["label"] for c in first.calls if "lr_search" in c["dir"].parts} == {"g"}  # only the listed label
    real = [c for c in first.calls if "trials" in c["dir"].parts]
    assert {c["label"]: c["lr"] for c in real} == {"bsp": 0.1, "g": 0.03}
    assert [c["provenance"]["source"] for c in real if c["label"] == "bsp"] == ["given", "given"]

    skip = FakeTrials()
    run_experiment(spec, run_dir=tmp_path / "b", report=False, trial_fn=skip, lr_search="skip")
    assert all("trials" in c["dir"].parts and c["lr"] == 0.1 for c in skip.calls)
    assert all(c["provenance"]["source"] == "given" and "skipped" in c["provenance"]["note"] for c in skip.calls)
    assert not (tmp_path / "b" / "lr_search").exists()

    again = FakeTrials()
    run_experiment(spec, run_dir=tmp_path / "c", report=False, trial_fn=again, lr_search_from=tmp_path / "a")
    assert all("trials" in c["dir"].parts for c in again.calls)  # no search trial ran
    g = [c for c in again.calls if c["label"] == "g"]
    assert all(c["lr"] == 0.03 and c["provenance"]["reused"] for c in g)
    with pytest.raises(ValidationError) as e:
        load_picks(tmp_path / "b")
    assert e.value.field == "--lr-search-from"


def test_search_only_runs_no_trial_and_returns_the_picks(tmp_path):
    """``--lr-search-only``: the search and its records, no trial, no report; the picks are the
    result, and a later ``--lr-search-from`` of that run trains at them."""
    spec = _spec(values=[0.01, 0.03, 0.1, 0.3, 1.0], steps=20)
    fake = FakeTrials()
    res = run_experiment(spec, run_dir=tmp_path / "s", trial_fn=fake, lr_search="only")  # report left on
    assert fake.calls and all("lr_search" in c["dir"].parts for c in fake.calls)
    assert res.trials == [] and not (tmp_path / "s" / "trials").exists()
    assert not (tmp_path / "s" / "summary.md").exists() and not (tmp_path / "s" / "tables").exists()
    assert {k: v["lr"] for k, v in res.picks.items()} == BEST
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["lr_search"]["mode"] == "only" and manifest["trials"] == []
    later = FakeTrials()
    run_experiment(spec, run_dir=tmp_path / "t", report=False, trial_fn=later, lr_search_from=tmp_path / "s")
    assert len(later.calls) == 4 and all(c["lr"] == BEST[c["label"]] for c in later.calls)


def test_search_only_cli(tmp_path):
    """From the command line: a spec without ``lr_search:`` is a usage error naming the flag (exit 2,
    nothing made); the picks table names the edge warning."""
    import subprocess
    import sys

    import yaml

    from testbed.experiments.cli import picks_table

    spec = tmp_path / "plain.yaml"
    spec.write_text(yaml.safe_dump(BASE))
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", str(spec), "--lr-search-only",
                        "--results", str(tmp_path / "res")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--lr-search-only" in r.stderr and "lr_search:" in r.stderr
    assert not (tmp_path / "res").exists()
    r = subprocess.run([sys.executable, "-m", "testbed.cli", "run", "--help"], capture_output=True, text=True)
    assert "--lr-search-only" in r.stdout
    table = picks_table({"bsp": {"lr": 0.1, "source": "searched", "at_edge": "largest"},
                         "g": {"lr": 0.03, "source": "searched"}})
    assert "largest value tried" in table and "0.03" in table
    assert "no pick" in picks_table({})


def test_every_value_failed_keeps_the_given_lr(tmp_path):
    spec = _spec(values=[0.01, 0.03, 0.1, 0.3], schemes=["bsp"])
    fake = FakeTrials(fail={0.01, 0.03, 0.1, 0.3})
    run_experiment(spec, run_dir=tmp_path / "r", report=False, trial_fn=fake)
    real = [c for c in fake.calls if "trials" in c["dir"].parts and c["label"] == "bsp"]
    assert all(c["lr"] == 0.1 and c["provenance"]["source"] == "given" for c in real)


class Diverging(FakeTrials):
    """The fake's curves, except that lr 1.0 diverges: its loss climbs and turns NaN."""

    def __call__(self, spec, scheme, rep, trial_dir, **kw):
        res = super().__call__(spec, scheme, rep, trial_dir, **kw)
        if scheme.training["optimizer"]["lr"] == 1.0:
            (trial_dir / "metrics.csv").write_text("step,wall_s,loss,acc,expert,updates\n0,0.0,2.3,0.1,,0\n"
                                                   "10,1.0,2.6,0.1,,10\n20,2.0,nan,0.1,,20\n")
        return res


def test_give_up_reaches_the_search_trials_only_and_the_records_say_why(tmp_path):
    """``lr_search.give_up`` becomes each search trial's ``stop.give_up`` (the real trials keep
    their own stop: every repetition runs to its target or cap); a value that gave up is a row
    whose reason names the time and the rule, and it is never the pick."""
    spec = _spec(values=[0.01, 0.03, 0.1, 0.3, 1.0], steps=20,
                 give_up={"metric": "loss", "value": 1.9, "after_s": "2s"}, schemes=["bsp"])
    fake = Diverging()
    run_experiment(spec, run_dir=tmp_path / "r", report=False, trial_fn=fake)
    search = [c for c in fake.calls if "lr_search" in c["dir"].parts]
    real = [c for c in fake.calls if "trials" in c["dir"].parts]
    assert all(c["stop"]["give_up"] == {"metric": "loss", "value": 1.9, "after_s": 2.0} for c in search)
    assert real and all("give_up" not in c["stop"] for c in real)
    with (tmp_path / "r" / "lr_search" / "lr_search.csv").open() as f:
        rows = {float(r["lr"]): r for r in csv.DictReader(f)}
    # 0.01 never reaches 0.5: its first row at or past 2 s (t = 2.48 k, loss 1.985 - 0.05 k) is 1.935
    assert rows[0.01]["reason"] == "gave up at 2.5 s (loss 1.935 > 1.9)"
    # 1.0: 2.6 at 1.0 s is before after_s; the NaN at 2.0 s gives up (non-finite: at any time)
    assert rows[1.0]["reason"] == "gave up at 2.0 s (non-finite loss)"
    assert rows[0.3]["reason"] == "" and rows[0.3]["picked"] == "True"  # reached: no give-up said
    record = json.loads((tmp_path / "r" / "lr_search" / "lr_search.json").read_text())
    assert record["search"]["give_up"]["after_s"] == 2.0


@pytest.mark.parametrize("search, field", [
    ({"values": [0.1, 0.2, 0.3]}, "lr_search.values"),
    ({"values": [0.1, 0.2, 0.3, -1.0]}, "lr_search.values"),
    ({"values": {"low": 0.1, "high": 1.0, "count": 3}}, "lr_search.values.count"),
    ({"values": {"low": 1.0, "high": 0.1}}, "lr_search.values.high"),
    ({"seed": 4}, "lr_search.seed"),
    ({"schemes": ["nope"]}, "lr_search.schemes[0]"),
    ({"steps": 0}, "lr_search.steps"),
    ({"colour": 1}, "lr_search.colour"),
    ({"give_up": {"metric": "loss", "value": 2.0, "after_s": -1}}, "lr_search.give_up.after_s"),
    ({"give_up": {"metric": "los", "value": 2.0, "after_s": 1}}, "lr_search.give_up.metric"),
])
def test_bad_sections_name_the_field(search, field):
    with pytest.raises(ValidationError) as e:
        _spec(**search)
    assert e.value.field == field, str(e.value)


def test_repetitions_override_cannot_reuse_the_search_seed(tmp_path):
    spec = _spec(seed=5)  # fine for 2 repetitions (3, 4)
    spec.repetitions = 3  # --repetitions 3: repetition 2 has seed 5
    with pytest.raises(ValidationError) as e:
        run_experiment(spec, run_dir=tmp_path / "r", report=False, trial_fn=FakeTrials())
    assert e.value.field == "lr_search.seed"


def test_bundled_demos_use_the_linear_rule():
    from testbed.experiments.spec import load_experiment
    from testbed.training.config import validate_training

    for name in ("demo", "demo_reduced"):
        spec = load_experiment(name)
        for s in spec.schemes:
            opt = validate_training(s.training).optimizer
            assert opt.lr_rule == ("sqrt" if opt.name == "adam" else "linear"), (name, s.label)
