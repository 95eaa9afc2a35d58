"""CPU saturation: the arithmetic of the verdict, and the sampler against a process that really spins."""

from __future__ import annotations

import subprocess
import sys
import time

from testbed.collect.saturation import CpuSaturation, machine_ticks, process_ticks, summarise
from testbed.experiments.trial import faithfulness


def test_the_verdict_needs_more_than_ten_percent_of_samples_saturated() -> None:
    assert summarise([0.5] * 9 + [0.96])["saturated"] is False  # 10 %: not more than 10 %
    s = summarise([0.5] * 8 + [0.95, 1.0])
    assert s["saturated"] is True and s["saturated_fraction"] == 0.2 and s["samples"] == 10
    assert summarise([])["saturated"] is False and summarise([])["mean"] is None


def test_a_spinning_daemon_is_seen_saturated_and_an_idle_one_not() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy0, total0 = machine_ticks()
        assert total0 > busy0 > 0 and process_ticks(spin.pid) is not None
        cpu = CpuSaturation({"spin": spin.pid, "idle": idle.pid}, interval_s=0.25).start()
        time.sleep(2.6)
        rec = cpu.stop()
    finally:
        spin.kill()
        idle.kill()
        spin.wait()
        idle.wait()
    d = rec["impairment_daemons"]
    assert d["spin"]["samples"] >= 6 and d["idle"]["samples"] >= 6
    # one core's worth when it has one; a loaded two-core machine may give it less, never more
    assert d["spin"]["mean"] > 0.4 and d["idle"]["mean"] < 0.05
    assert d["idle"]["saturated"] is False
    assert 0.0 <= rec["machine"]["mean"] <= 1.0
    assert process_ticks(spin.pid) is None  # gone: sampled as absent, not as an error


def test_faithfulness_names_every_reason() -> None:
    assert faithfulness({}) == []  # never got as far as the self-test
    m = {"selftest": {"problems": ["a<->b: min RTT 61.00 ms, spec 40.00 ms"]},
         "cpu_saturation": {"saturated": ["machine CPU >= 95% in 40% of samples (cores: 2)"]}}
    assert faithfulness(m) == ["self-test: a<->b: min RTT 61.00 ms, spec 40.00 ms",
                               "CPU saturated: machine CPU >= 95% in 40% of samples (cores: 2)"]
