"""What another server samples during a trial (testbed.cluster.sampling): its trainers found by their argv,
shape mode's TCP narrowing, and its CPU saturation joining the trial's verdict."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from testbed.cluster.sampling import TrainerWatch, shape_tcp_target, trainer_of
from testbed.collect.samplers import ProcSampler
from testbed.experiments.trial import faithfulness, remote_cpu_saturation

JOBS = "/var/tmp/geo-testbed-trials/s2/r-t/jobs"


def test_only_a_training_module_on_a_job_of_this_trial_is_a_trainer():
    job = f"{JOBS}/b-h1.worker.1.json"
    py = "/opt/venv/bin/python"
    assert trainer_of([py, "-m", "testbed.training.worker", job], JOBS) == job
    assert trainer_of([py, "-m", "testbed.training.server", job], JOBS + "/") == job
    # the ssh-side wrapper names the job too, but runs the CLI
    wrapper = [py, "-m", "testbed.cli", "net", "exec", "--until-eof", "b-h1", "--", "env", "A=1", py, "-m",
               "testbed.training.worker", job]
    assert trainer_of(wrapper, JOBS) is None
    assert trainer_of(["env", "A=1", py, "-m", "testbed.training.worker", job], JOBS) is None
    # another trial's job, or not a job file
    assert trainer_of([py, "-m", "testbed.training.worker", "/var/tmp/other/jobs/b-h1.json"], JOBS) is None
    assert trainer_of([py, "-m", "testbed.training.worker", f"{JOBS}/notes.txt"], JOBS) is None


class Msg(dict):
    pass


def test_shape_mode_keeps_trainer_connections_and_leaves_ssh_and_the_rest_out():
    t = shape_tcp_target("s1", {"address": "10.0.0.1", "control_ports": [22, 2222],
                                "egress": [{"address": "10.0.0.2"}, {"address": "10.0.0.3"}]})
    assert t.node == "s1" and t.netns is None

    def conn(src, sport, dst, dport):
        return Msg(idiag_src=src, idiag_sport=sport, idiag_dst=dst, idiag_dport=dport)

    assert t.keeps(conn("10.0.0.1", 40000, "10.0.0.2", 29500))      # a trainer to another server's
    assert t.keeps(conn("10.0.0.1", 40000, "10.0.0.1", 29500))      # two trainers of one server
    assert not t.keeps(conn("10.0.0.1", 40000, "10.0.0.2", 22))     # ssh out
    assert not t.keeps(conn("10.0.0.1", 2222, "10.0.0.3", 50000))   # ssh in, on the cluster's other port
    assert not t.keeps(conn("10.0.0.1", 40000, "192.0.2.7", 443))   # not the cluster's


def test_a_saturated_server_makes_the_trial_unfaithful_by_name():
    manifest = {"cpu_saturation": {"saturated": []}}
    remote_cpu_saturation(manifest, {"s2": {"machine": {"samples": 20}, "saturated": ["machine CPU >= 95% in 40% "
                                                                                      "of samples (cores: 2)"]},
                                     "s3": {"machine": {"samples": 20}, "saturated": []}})
    assert set(manifest["cpu_saturation"]["servers"]) == {"s2", "s3"}
    assert faithfulness(manifest) == ["CPU saturated: s2: machine CPU >= 95% in 40% of samples (cores: 2)"]
    untouched = {"cpu_saturation": {"saturated": []}}
    remote_cpu_saturation(untouched, {})
    assert untouched == {"cpu_saturation": {"saturated": []}}


def test_a_running_trainer_is_found_and_sampled_as_its_job_says(tmp_path):
    """A real process with a trainer's argv (a module under a ``testbed.training`` package of its own, so it
    only sleeps) is found within the watch's interval and sampled with its job's host, role and rank; a
    process of another trial is not."""
    pkg = tmp_path / "fake" / "testbed" / "training"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "fake" / "testbed", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "sleeper.py").write_text("import time\ntime.sleep(30)\n")
    out = tmp_path / "scratch"
    (out / "jobs").mkdir(parents=True)
    job = out / "jobs" / "b-h1.worker.1.json"
    job.write_text(json.dumps({"host": "b-h1", "role": "worker", "rank": 1}))
    other = tmp_path / "other" / "jobs"
    other.mkdir(parents=True)
    (other / "c-h1.worker.2.json").write_text(json.dumps({"host": "c-h1", "role": "worker", "rank": 2}))
    procs = [subprocess.Popen([sys.executable, "-m", "testbed.training.sleeper", str(p)], cwd=tmp_path / "fake")
             for p in (job, other / "c-h1.worker.2.json")]
    sampler = ProcSampler(tmp_path / "procs.jsonl", t0_ns=time.time_ns(), rate_hz=20)
    watch = TrainerWatch(str(out), sampler)
    try:
        sampler.start()
        watch.start()
        deadline = time.monotonic() + 10
        while not watch.seen and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        watch.stop()
        sampler.stop()
        for p in procs:
            p.kill()
            p.wait()
    assert watch.seen == {procs[0].pid} and watch.errors == []
    rows = [json.loads(ln) for ln in (tmp_path / "procs.jsonl").read_text().splitlines()]
    assert rows and {(r["host"], r["role"], r["rank"], r["pid"]) for r in rows} == {("b-h1", "worker", 1,
                                                                                      procs[0].pid)}
    assert all(r["rss_bytes"] > 1e6 for r in rows)


def test_the_launcher_judges_another_servers_cpu_from_the_barrier():
    """What a remote sampler's last line carries (its verdict over every sample, and its samples) becomes the
    trial's record of that server judged from the barrier; without the barrier, or from a sampler that sent
    no samples, that server's own verdict stands."""
    from types import SimpleNamespace

    from testbed.cluster.trialnet import ClusterTrialNetwork
    from testbed.collect.saturation import CpuSaturation

    there = CpuSaturation(interval_s=0.5)
    there.machine = [(500_000_000 * i, 1.0 if i < 20 else 0.3) for i in range(100)]  # 10 s start-up, both cores
    own = there.record()
    assert own["saturated"]  # 20 % of every sample
    net = SimpleNamespace(sampler_stats={"s2": {"cpu_saturation": own}, "s3": {"cpu_saturation": own}},
                          cpu_samples={"s2": json.loads(json.dumps(there.samples(0)))})
    judged = ClusterTrialNetwork.remote_cpu_saturation(net, 10.0)
    assert judged["s2"]["judged"] == "after the start barrier" and judged["s2"]["saturated"] == []
    assert judged["s2"]["startup"]["machine"]["samples"] == 20
    assert judged["s3"] == own  # no samples came from s3
    assert ClusterTrialNetwork.remote_cpu_saturation(net, None) == {"s2": own, "s3": own}
