"""Container images across servers: every server that holds ``runtime: docker`` hosts runs the launcher's image.

A trainer in a container runs the image's Python and torch, so two servers with two builds of "the same" tag
would train with different software and nothing in the records would show it.  Before any part is built the
launcher reads, over ssh, the id of every image its DCs use on every server that holds them; a server that
lacks it, or holds another image under the tag, gets the launcher's (``docker save`` here piped into ``docker
load`` there: no registry, as nothing can be pulled).  The report keeps every server's image id, and whether it
was sent, for the manifest.  The launcher must hold each image itself (``testbed image build`` makes the
testbed's): it is the reference every server is held to.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

from topologies.model import Topology
from traffic_control.errors import ValidationError

from .launch import as_root
from .model import Cluster
from .remote import SSH_FAILED, Remote, RemoteError

#: How long sending one image may take (1.4 GB took 26 s between two stand-ins on one machine).
SEND_TIMEOUT_S = 1800.0


def needed(topo: Topology, assignment: dict[str, str], launcher: str) -> dict[str, dict[str, list[str]]]:
    """Other server -> image -> the DCs there that use it (servers without container hosts are left out)."""
    from testbed.network.docker_hosts import DEFAULT_IMAGE

    out: dict[str, dict[str, list[str]]] = {}
    for dc in topo.dcs:
        server = assignment.get(dc.name)
        if dc.runtime == "docker" and server is not None and server != launcher:
            out.setdefault(server, {}).setdefault(dc.image or DEFAULT_IMAGE, []).append(dc.name)
    return out


def size_of(image: str) -> int | None:
    """The image's size here (bytes, as ``docker images`` counts it)."""
    r = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True,
                       timeout=30)
    return int(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip().isdigit() else None


def remote_image_id(remote: Remote, image: str) -> str | None:
    """The image's id on the server (None: it has no such image); RemoteError when its Docker does not answer."""
    cp = remote.run(as_root(remote.server, ["docker", "image", "inspect", "--format", "{{.Id}}", image]),
                    timeout=60, check=False)
    if cp.returncode == 0:
        return cp.stdout.strip()
    if "No such image" in cp.stderr or "no such image" in cp.stderr.lower():
        return None
    raise RemoteError(remote.server, f"its Docker daemon does not answer: {cp.stderr.strip()[-300:]}",
                      "install Docker there and start its daemon (systemctl start docker), or place the "
                      "runtime: docker DCs on other servers")


def send(remote: Remote, image: str) -> None:
    """``docker save`` here piped straight into ``docker load`` on the server (over its own ssh connection)."""
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert save.stdout is not None
    try:
        load = subprocess.Popen(remote.command(as_root(remote.server, ["docker", "load", "--quiet"]), shared=False),
                                stdin=save.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        save.stdout.close()  # the pipe is load's now: save sees EPIPE if ssh ends early
    try:
        _, err = load.communicate(timeout=SEND_TIMEOUT_S)
        save_err = save.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        load.kill()
        save.kill()
        load.wait()
        save.wait()
        raise RemoteError(remote.server, f"sending image {image} took over {SEND_TIMEOUT_S:.0f} s",
                          "check the network to the server, or load the image there by hand") from None
    if save.returncode != 0:
        raise RemoteError(remote.server, f"docker save {image} failed on the launcher: "
                          f"{save_err.decode(errors='replace').strip()[-300:]}", "check `docker images` here")
    if load.returncode == SSH_FAILED:
        raise RemoteError(remote.server, "ssh failed while sending an image", "check the server's network")
    if load.returncode != 0:
        raise RemoteError(remote.server, f"docker load of {image} failed: {err.decode(errors='replace').strip()[-300:]}",
                          "check the free space of its Docker data root (docker system df)")


def ensure(topo: Topology, cluster: Cluster, assignment: dict[str, str],
           log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Every other server holding container hosts has the launcher's image(s), sent where missing or different.
    Returns server -> image -> {id, sent, and for one sent: bytes (its size), s}."""
    from testbed.network import docker_hosts

    wanted = needed(topo, assignment, cluster.launcher)
    if not wanted:
        return {}
    docker_hosts.require()
    ours: dict[str, str] = {}
    for image in sorted({i for per in wanted.values() for i in per}):
        iid = docker_hosts.image_id(image)
        if iid is None:
            dcs = sorted({d for per in wanted.values() for d in per.get(image, [])})
            i = [d.name for d in topo.dcs].index(dcs[0])
            raise ValidationError(f"dcs[{i}].image", f"image {image!r} (for DC {', '.join(dcs)} on other servers) is "
                                  "not on the launcher: it is the one every server is given",
                                  "build it here with `testbed image build` (or load it: docker images)")
        ours[image] = iid
    out: dict[str, dict[str, Any]] = {}
    for server, images in wanted.items():
        with Remote(cluster.server(server), cluster) as r:
            for image in sorted(images):
                theirs = remote_image_id(r, image)
                entry: dict[str, Any] = {"id": ours[image], "sent": False}
                if theirs != ours[image]:
                    log(f"{server}: sending image {image} ({'missing there' if theirs is None else 'another build there'})")
                    t = time.monotonic()
                    send(r, image)
                    entry["s"] = round(time.monotonic() - t, 1)
                    entry["bytes"] = size_of(image)
                    entry["sent"] = True
                    if remote_image_id(r, image) != ours[image]:
                        raise RemoteError(r.server, f"image {image} loaded there has another id than the launcher's",
                                          "remove the image there (docker rmi) and run again")
                    log(f"{server}: image {image} sent ({(entry['bytes'] or 0) / 1e6:.0f} MB in {entry['s']:.1f} s)")
                out.setdefault(server, {})[image] = entry
    return out
