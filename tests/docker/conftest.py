"""Docker hosts need a running daemon (CI starts one: WITH_DOCKER=1 in .ci/run) and root."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from testbed.network import docker_hosts

#: A network-only image: busybox (the kernel lab's busybox-static, a bootstrap package) and nothing else,
#: so a test of the network needs no trainer image.
BUSYBOX_IMAGE = "geo-testbed/test-busybox:latest"


def require_docker() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    ok, why = docker_hosts.available()
    if not ok:
        pytest.skip(f"Docker not usable here: {why}")


def build_trainer_image() -> str:
    """The testbed's own image, built as a user builds it (reused when its recipe is unchanged); its name."""
    import json

    from tests.conftest import run_cli

    require_docker()
    r = run_cli("image", "build", "--json", timeout=1800)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["name"]


@pytest.fixture(scope="session")
def busybox_image() -> str:
    require_docker()
    if docker_hosts.image_id(BUSYBOX_IMAGE) is None:
        busybox = shutil.which("busybox") or "/bin/busybox"
        if not Path(busybox).exists():
            pytest.skip("needs busybox (busybox-static, a bootstrap package)")
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "bin").mkdir()
            shutil.copy(busybox, Path(d) / "bin" / "busybox")
            for name in ("sh", "sleep", "cat"):
                (Path(d) / "bin" / name).symlink_to("busybox")
            tar = subprocess.Popen(["tar", "-C", d, "-c", "."], stdout=subprocess.PIPE)
            subprocess.run(["docker", "import", "-", BUSYBOX_IMAGE], stdin=tar.stdout, check=True,
                           capture_output=True)
            tar.wait()
    return BUSYBOX_IMAGE
