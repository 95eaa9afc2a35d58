"""runtime: docker in a topology: the keys, their checks, and the container each host becomes (no daemon)."""

from __future__ import annotations

import pytest

from testbed.images.builder import Recipe
from testbed.network import docker_hosts
from topologies import from_dict
from traffic_control.errors import ValidationError

LINKS = [{"a": "a", "b": "b", "rate": "10Mbit", "delay": "5ms"}]


def topo(a: dict, defaults: dict | None = None):
    return from_dict({"dcs": [{"name": "a", **a}, "b"], "links": LINKS, **({"defaults": defaults} if defaults else {})})


def test_runtime_keys_and_their_round_trip():
    t = topo({"runtime": "docker", "image": "me/trainer:1", "volumes": ["/data:/data:ro"], "env": {"X": "1"}})
    a, b = t.dc("a"), t.dc("b")
    assert (a.runtime, a.image, a.volumes, a.env) == ("docker", "me/trainer:1", ("/data:/data:ro",), (("X", "1"),))
    assert b.runtime == "process" and b.image is None
    again = from_dict(t.to_dict())
    assert again.dc("a") == a and again.dc("b") == b
    # from the defaults, a DC's own key winning
    t = topo({"runtime": "process"}, {"runtime": "docker"})
    assert t.dc("a").runtime == "process" and t.dc("b").runtime == "docker"


@pytest.mark.parametrize("dc, field, words", [
    ({"image": "x"}, "dcs[0].image", "process hosts"),
    ({"runtime": "docker", "volumes": ["data:/x"]}, "dcs[0].volumes[0]", "absolute"),
    ({"runtime": "docker", "volumes": ["/a:/b:rx"]}, "dcs[0].volumes[0]", "SRC:DST:ro"),
    ({"runtime": "dockr"}, "dcs[0].runtime", "process"),
    ({"runtime": "docker", "image": "bad image"}, "dcs[0].image", "image"),
])
def test_bad_runtime_keys_name_the_field_and_the_fix(dc, field, words):
    with pytest.raises(ValidationError) as e:
        topo(dc)
    assert e.value.field == field and words in str(e.value) and "fix" in str(e.value)


def test_a_container_gets_no_network_no_capability_its_limits_and_the_tree_read_only(tmp_path):
    cfg = docker_hosts.HostConfig("img:1", ("/data:/data:ro",), (("A", "b"),), cpu=0.5, memory=2**30)
    argv = docker_hosts.run_argv("east-h1", cfg, [tmp_path])
    s = " ".join(argv)
    for words in ("--network none", "--cap-drop ALL", "--name tb-east-h1", f"--label {docker_hosts.LABEL}=tb",
                  "--cpus 0.5", f"--memory {2**30}", f"--memory-swap {2**30}", "--volume /data:/data:ro",
                  f"--volume {tmp_path}:{tmp_path}:rw", "--env A=b",
                  f"--volume {docker_hosts.source_root()}:{docker_hosts.source_root()}:ro"):
        assert words in s, words
    assert argv[-2:] == ["img:1", *docker_hosts.KEEPALIVE[1:]] and "--privileged" not in argv


def test_a_trainers_environment_is_the_images_not_the_venvs():
    env = {"PATH": "/work/.venv/bin:/usr/bin", "VIRTUAL_ENV": "/work/.venv", "TESTBED_OWNER": "tb",
           "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1", "SECRET": "x"}
    out = docker_hosts.trainer_env(env, docker_hosts.HostConfig("i", env=(("NCCL_DEBUG", "INFO"),)))
    assert out["PATH"] == docker_hosts.CONTAINER_PATH and "VIRTUAL_ENV" not in out and "SECRET" not in out
    assert out["TESTBED_OWNER"] == "tb" and out["GLOO_SOCKET_IFNAME"] == "eth0" and out["NCCL_DEBUG"] == "INFO"
    assert out["PYTHONPATH"] == str(docker_hosts.source_root())


def test_the_image_recipe_names_its_tag():
    r = Recipe(["numpy==2.0", "torch==2.13.0"])
    assert r.tag().startswith("geo-testbed/trainer:") and r.tag() == Recipe(["numpy==2.0", "torch==2.13.0"]).tag()
    assert Recipe(["numpy==2.1", "torch==2.13.0"]).tag() != r.tag()
