"""CPU saturation: the arithmetic of the verdict, and the sampler against a process that really spins."""

from __future__ import annotations

import json
import os
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


def test_only_samples_after_the_start_barrier_are_judged() -> None:
    """The start-up burst (every trainer importing torch at once) is kept but not judged: a short trial
    whose only saturated samples came before its barrier is faithful, one saturated after it is not."""
    cpu = CpuSaturation(interval_s=0.5)
    barrier = 10_000_000_000
    startup = [(barrier - 500_000_000 * (20 - i), 1.0) for i in range(20)]  # 10 s of both cores full
    cpu.machine = startup + [(barrier + 500_000_000 * i, 0.3) for i in range(100)]  # 50 s of training
    every = cpu.record()
    assert every["judged"] == "every sample" and every["machine"]["saturated"] is True  # 20 of 120
    assert "startup" not in every and every["saturated"] == ["machine CPU >= 95% in 17% of samples (cores: "
                                                            f"{os.cpu_count()})"]
    after = cpu.record(barrier)
    assert after["judged"] == "after the start barrier" and after["saturated"] == []
    assert after["machine"]["samples"] == 100 and after["machine"]["saturated"] is False
    assert after["startup"]["machine"]["samples"] == 20 and after["startup"]["machine"]["saturated_fraction"] == 1.0
    # a sample that began before the barrier is start-up even if it ended after it
    cpu.machine = [(barrier - 1, 1.0)] + [(barrier + 500_000_000 * i, 1.0 if i < 12 else 0.2) for i in range(100)]
    judged = cpu.record(barrier)
    assert judged["machine"]["samples"] == 100 and judged["machine"]["saturated"] is True  # 12 % in training
    assert judged["startup"]["machine"]["samples"] == 1
    # the daemons are judged over the same window
    cpu.per_daemon = {"a-r:w-b": [(barrier - 1, 1.0)] * 50 + [(barrier, 0.1)] * 10}
    rec = cpu.record(barrier)
    assert rec["impairment_daemons"]["a-r:w-b"]["saturated"] is False
    assert cpu.record()["impairment_daemons"]["a-r:w-b"]["saturated"] is True


def test_real_samples_carry_when_they_began() -> None:
    t = time.time_ns()
    cpu = CpuSaturation(interval_s=0.1).start()
    time.sleep(0.55)
    cpu.halt()
    times = [s for s, _ in cpu.machine]
    assert len(times) >= 3 and times == sorted(times) and times[0] >= t
    assert cpu.record(time.time_ns())["machine"]["samples"] == 0  # none began after now
    assert cpu.stop()["machine"]["samples"] == len(times)  # stop after halt: the same samples, judged whole


def test_another_servers_samples_are_judged_from_the_launchers_barrier() -> None:
    """Across servers another server sends its samples timed from t0 (its clock's t0: the launcher's plus its
    offset); the launcher places them on its own t0 and judges them from the barrier as it judges its own."""
    remote_t0 = 5_000_000_000_000  # the other server's clock runs far off the launcher's
    there = CpuSaturation({"b-r:w-a": 1}, interval_s=0.5)
    there.cores = 64
    there.machine = [(remote_t0 + 500_000_000 * i, 1.0 if i < 24 else 0.2) for i in range(120)]  # 12 s start-up
    there.per_daemon = {"b-r:w-a": [(remote_t0 + 500_000_000 * i, 0.99 if i < 24 else 0.1) for i in range(120)]}
    sent = json.loads(json.dumps(there.samples(remote_t0)))  # as it crosses: the sampler's last JSON line
    assert sent["cores"] == 64 and len(sent["machine"]) == 120 and sent["machine"][1] == [0.5, 1.0]
    launcher_t0 = 1_700_000_000_000_000_000
    here = CpuSaturation.from_samples(sent, launcher_t0)
    barrier_s = 12.0
    judged = here.record(launcher_t0 + round(barrier_s * 1e9))
    assert judged == there.record(remote_t0 + round(barrier_s * 1e9))  # the same verdict as judged there
    assert judged["judged"] == "after the start barrier" and judged["saturated"] == []
    assert judged["machine"]["samples"] == 96 and judged["startup"]["machine"]["samples"] == 24
    every = here.record()  # judged over every sample, the start-up marks it: 20 % of samples
    assert every["saturated"] == ["machine CPU >= 95% in 20% of samples (cores: 64)",
                                  "impairment daemon b-r:w-a CPU >= 95% of a core in 20% of samples"]
