"""training.backend: nccl: refused where NCCL cannot run (no GPU per worker), and, where it runs, told to
keep every byte on the emulated interface's sockets (the GPU check runs it on a GPU machine)."""

from __future__ import annotations

import os

import pytest

from testbed.experiments.spec import parse_experiment
from testbed.training.config import validate_training
from testbed.training.dist import backend_of, nccl_env
from testbed.training.jobs import Placement, make_jobs
from traffic_control.errors import ValidationError


def _experiment(training: dict, schemes: list | None = None, **topo: object) -> dict:
    t = {"name": "t", "dcs": [{"name": "a", "hosts": 2, **topo.pop("a", {})}, {"name": "b", "hosts": 1, **topo.pop("b", {})}],
         "links": [{"a": "a", "b": "b", "rate": "100Mbit", "delay": "5ms"}], "ps": "a", **topo}
    out = {"name": "x", "topology": t, "training": {"workload": {"name": "digits"}, "scheme": "bsp", **training}}
    if schemes is not None:
        out["schemes"] = schemes
    return out


def test_nccl_env_keeps_every_byte_on_the_emulated_interface():
    env = nccl_env("a-h1-eth0", "a-h1")
    assert env["NCCL_SOCKET_IFNAME"] == "a-h1-eth0" and env["NCCL_NET"] == "Socket"
    # no verbs, peer copies, shared memory or switch offload: paths that would skip the shaped links
    assert {env[k] for k in ("NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")} == {"1"}
    assert env["NCCL_NVLS_ENABLE"] == env["NCCL_COLLNET_ENABLE"] == "0"
    # each emulated host its own node; the ring the spans count, payload-sized messages
    assert env["NCCL_HOSTID"] == "a-h1" and env["NCCL_ALGO"] == "Ring" and env["NCCL_PROTO"] == "Simple"
    assert "NCCL_SOCKET_IFNAME" not in nccl_env(None, "h")


def test_gloo_stays_the_default_and_nccl_keeps_gloo_for_cpu_tensors():
    job = make_jobs({"workload": "digits", "scheme": "bsp"},
                    [Placement("a-h1", "a", "10.0.0.1", "a-h1-eth0"), Placement("a-h2", "a", "10.0.0.2")], "/tmp/x", 0)[0]
    assert job.training.backend == "gloo" and backend_of(job) == "gloo"
    job.training.backend = "nccl"
    assert backend_of(job) == "cpu:gloo,cuda:nccl"


def test_nccl_on_the_cpu_is_refused_naming_the_field():
    with pytest.raises(ValidationError) as e:
        validate_training({"workload": "digits", "scheme": "bsp", "backend": "nccl", "device": "cpu"})
    assert e.value.field == "training.backend" and "device: cuda" in str(e.value)
    with pytest.raises(ValidationError) as e:
        validate_training({"workload": "digits", "scheme": "bsp", "backend": "mpi"})
    assert e.value.field == "training.backend" and "nccl" in str(e.value)


@pytest.mark.parametrize(("topo", "words"), [
    ({}, "DC(s) a, b give their hosts no gpus"),
    ({"a": {"gpus": 1}}, "DC(s) b give their hosts no gpus"),
    ({"a": {"gpus": 1}, "b": {"gpus": 1}, "gpu_sharing": True}, "gpu_sharing: true"),
])
def test_nccl_needs_one_gpu_per_worker(topo, words):
    with pytest.raises(ValidationError) as e:
        parse_experiment(_experiment({"backend": "nccl"}, **topo))
    assert e.value.field == "training.backend" and words in str(e.value) and "backend: gloo" in str(e.value)


def test_a_scheme_entry_that_asks_for_nccl_is_named():
    with pytest.raises(ValidationError) as e:
        parse_experiment(_experiment({}, schemes=[{"label": "b", "scheme": "bsp"},
                                                  {"label": "n", "scheme": "bsp", "training": {"backend": "nccl"}}]))
    assert e.value.field == "schemes[1].training.backend", str(e.value)


def test_nccl_with_a_gpu_per_worker_is_accepted():
    spec = parse_experiment(_experiment({"backend": "nccl"}, a={"gpus": 1}, b={"gpus": [3]}))
    assert spec.schemes[0].training["backend"] == "nccl"


def test_a_worker_without_cuda_stops_with_the_fix(tmp_path, monkeypatch):
    """What a trainer does when NCCL was asked for and torch sees no GPU (this CPU machine)."""
    import torch

    from testbed.training.runtime import setup_process

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    job = make_jobs({"workload": "digits", "scheme": "bsp", "backend": "nccl"},
                    [Placement("a-h1", "a", "10.0.0.1", "a-h1-eth0"), Placement("a-h2", "a", "10.0.0.2")],
                    str(tmp_path), 0)[0]
    monkeypatch.setattr("signal.signal", lambda *a: None)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # setup_process writes the process's environment
    threads = torch.get_num_threads()
    try:
        with pytest.raises(RuntimeError, match="backend: nccl needs a CUDA device, but a-h1 has none"):
            setup_process(job)
        assert os.environ["NCCL_SOCKET_IFNAME"] == "a-h1-eth0"  # what NCCL would have been told
    finally:
        torch.set_num_threads(threads)


def test_nccl_on_a_machine_without_gpus_is_refused_from_the_command_line(tmp_path):
    """As a user meets it: `testbed run` exits 2 naming the field before any network is built."""
    import yaml

    from testbed.network.gpus import machine_gpus
    from tests.conftest import run_cli

    if machine_gpus():
        pytest.skip("this machine has GPUs")
    spec = tmp_path / "n.yaml"
    spec.write_text(yaml.safe_dump(_experiment({"backend": "nccl", "stop": {"steps": 2}},
                                               a={"gpus": 1}, b={"gpus": 1})))
    r = run_cli("run", str(spec), "--results", str(tmp_path / "out"))
    assert r.returncode == 2 and "dcs[0].gpus: this machine has no GPU" in r.stderr, r.stderr
    assert not list((tmp_path / "out").glob("*/manifest.json"))
