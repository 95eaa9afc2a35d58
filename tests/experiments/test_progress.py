"""The progress display: plain lines off a terminal, a live display sized to the terminal on one."""

from __future__ import annotations

import io
import json
import re

import pytest

from testbed.experiments.progress import Progress, _fmt_eta

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_plain_lines_off_a_terminal() -> None:
    buf = io.StringIO()
    p = Progress(4, heading="point 2/8", stream=buf, interval_s=0)
    assert p._rich is None  # a StringIO is not a TTY
    p.start_trial("bsp r0", 100)
    p.update(step=25, loss="1.234")
    p.log("trial bsp r0: building two_dc ...")
    p.finish_trial()
    p.start_trial("gsyn r0", None)  # wall-clock bound only: steps without a total
    p.update(step=7)
    out = buf.getvalue().splitlines()
    assert "point 2/8 trial 1/4 bsp r0: step 25/100  loss 1.234" in out[1]
    assert "trial bsp r0: building two_dc ..." in out
    assert any(line.startswith("point 2/8 trial 2/4 gsyn r0: step 7 ") for line in out)
    assert all("\r" not in line and "\x1b" not in line for line in out)  # nothing redrawn


def test_plain_lines_are_rate_limited() -> None:
    buf = io.StringIO()
    p = Progress(1, stream=buf, interval_s=3600)
    p.start_trial("asp r0", 50)
    for k in range(200):
        p.update(step=k)
    assert len(buf.getvalue().splitlines()) == 1  # the first status, then quiet for an hour


def test_the_first_status_prints_on_a_freshly_booted_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """time.monotonic() counts from boot: 5 s after boot the first line must still come (it did not,
    once, on a CI machine up for less than the test's interval)."""
    from testbed.experiments import progress as mod

    monkeypatch.setattr(mod.time, "monotonic", lambda: 5.0)
    buf = io.StringIO()
    p = Progress(1, stream=buf, interval_s=3600)
    p.start_trial("asp r0", 50)
    p.update(step=1)
    assert len(buf.getvalue().splitlines()) == 1


def test_fraction_and_eta_count_steps_of_the_running_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("testbed.experiments.progress.time.monotonic", lambda: clock[0])
    p = Progress(4, stream=io.StringIO())
    p.start_trial("a", 10)
    p.update(step=5)
    assert p.fraction() == pytest.approx(0.125)
    assert p.eta_s() is None  # too early to extrapolate
    clock[0] += 10
    p.finish_trial()
    assert p.fraction() == pytest.approx(0.25)
    assert p.eta_s() == pytest.approx(30)
    assert _fmt_eta(75) == "1:15" and _fmt_eta(3725) == "1:02:05" and _fmt_eta(None) == "-"


def test_a_trial_bounded_by_time_counts_its_elapsed_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A huge step count with a 100 s wall bound: after 50 s at step 10 the trial is half done, not
    1e-5 done (an ETA of hundreds of hours was printed before); never a whole trial before it ends."""
    clock = [1000.0]
    monkeypatch.setattr("testbed.experiments.progress.time.monotonic", lambda: clock[0])
    p = Progress(2, stream=io.StringIO())
    p.start_trial("asp r0", 1_000_000, "100s")
    clock[0] += 50
    p.update(step=10)
    assert p.fraction() == pytest.approx(0.25)
    assert p.eta_s() == pytest.approx(150)
    clock[0] += 500
    assert p.fraction() == pytest.approx(0.99 / 2)
    p.finish_trial()
    p.start_trial("gsyn r0", 1_000_000)  # no wall bound: steps only, as before
    clock[0] += 50
    assert p.fraction() == pytest.approx(0.5)


@pytest.mark.parametrize("columns", [40, 100])
def test_live_display_fits_the_terminal(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    monkeypatch.setenv("COLUMNS", str(columns))
    buf = io.StringIO()
    with Progress(3, stream=buf, live=True) as p:
        assert p._rich is not None
        p.start_trial("pgcs-blp r0", 40)
        p.update(step=10, loss="2.5")
        p.log("trial pgcs-blp r0: OK in 19.4 s")
        p._rich.refresh()
    text = ANSI.sub("", buf.getvalue())
    lines = [ln for chunk in text.split("\r") for ln in chunk.split("\n") if ln.strip()]
    assert "trial pgcs-blp r0: OK in 19.4 s" in lines
    assert any("trials" in ln and "ETA" in ln for ln in lines), lines
    assert max(len(ln) for ln in lines) <= columns, [ln for ln in lines if len(ln) > columns]


def test_ctrl_c_never_cuts_a_trials_teardown() -> None:
    """A second Ctrl-C inside the teardown (the runner's handler raises then) is noted, the block
    runs to its end, and the run's flag logic decides; with Python's default handler the
    KeyboardInterrupt comes after the block."""
    import os
    import signal

    from testbed.experiments.trial import interrupts_deferred

    presses: list[str] = []

    def runner_handler(signum: int, frame: object) -> None:  # as the runner's on_sigint
        presses.append("press")
        if len(presses) > 1:
            raise KeyboardInterrupt

    said: list[str] = []
    old = signal.signal(signal.SIGINT, runner_handler)
    try:
        done = []
        with interrupts_deferred(said.append):
            os.kill(os.getpid(), signal.SIGINT)  # first press: sets the flag
            os.kill(os.getpid(), signal.SIGINT)  # second: would raise; deferred
            done.append("teardown finished")
        assert done == ["teardown finished"] and presses == ["press", "press"]
        assert len(said) == 1 and "tearing the trial down first" in said[0]
        assert signal.getsignal(signal.SIGINT) is runner_handler  # restored
        signal.signal(signal.SIGINT, signal.default_int_handler)
        done.clear()
        with pytest.raises(KeyboardInterrupt), interrupts_deferred(said.append):
            os.kill(os.getpid(), signal.SIGINT)
            done.append("teardown finished")
        assert done == ["teardown finished"]
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_second_ctrl_c_after_the_trial_is_only_noted(tmp_path, monkeypatch, capsys) -> None:
    """Inside a trial a second Ctrl-C aborts it (KeyboardInterrupt, which run_trial turns into
    "interrupted"); once the trial has returned the run is already ending, and a second press
    must not raise from wherever it lands (once in CI: an asyncio loop's ``__del__``, printed as
    a traceback by a run that otherwise stopped cleanly)."""
    import os
    import signal

    from testbed.experiments import runner
    from testbed.experiments.runner import run_experiment
    from testbed.experiments.spec import parse_experiment
    from testbed.experiments.trial import TrialResult

    spec = parse_experiment({"name": "t", "topology": "two_dc", "training": {"workload": {"name": "digits"},
                             "stop": {"steps": 5}}, "schemes": ["bsp", "asp"],
                             "collectors": {"links": False, "procs": False, "trace": False}})
    seen: dict[str, object] = {}

    def trial(spec, scheme, rep, trial_dir, progress=None, log=None, stop_flag=None, name=None):
        trial_dir.mkdir(parents=True)
        os.kill(os.getpid(), signal.SIGINT)  # the first press: stop after this trial
        seen["flag"] = stop_flag()
        with pytest.raises(KeyboardInterrupt):  # a second one inside the trial aborts it
            os.kill(os.getpid(), signal.SIGINT)
        return TrialResult(scheme.label, rep, trial_dir, "interrupted", "Ctrl-C")

    finish = runner.Progress.finish_trial

    def finish_then_press(self, *a, **k):  # after the trial returned: a third press
        finish(self, *a, **k)
        os.kill(os.getpid(), signal.SIGINT)

    reported: list[str] = []

    def report_with_a_press(run_dir, log=print):  # and a fourth while the report is made
        os.kill(os.getpid(), signal.SIGINT)
        reported.append("report finished")

    monkeypatch.setattr(runner.Progress, "finish_trial", finish_then_press)
    monkeypatch.setattr(runner, "make_report", report_with_a_press)
    old = signal.getsignal(signal.SIGINT)
    res = run_experiment(spec, run_dir=tmp_path / "run", report=True, trial_fn=trial)
    assert reported == ["report finished"]
    assert seen["flag"] is True
    assert res.interrupted and [t.label for t in res.trials] == ["bsp"]  # asp never started
    assert "already stopping" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is old
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["interrupted"] is True
