"""Docker containers as trainer hosts (``runtime: docker``): Containernet's habit, on the testbed's network.

A container is started with ``--network none`` (Docker's own networking stays
out of the emulated path), labelled as the testbed's, and given the limits the
spec asks for (``--cpus``, ``--memory``).  The node's network namespace *is*
the container's: the emulation moves its veth in, addresses, routes and shapes
it exactly as for a process host, from the host side (``tc``, netlink,
sysctls), so the container needs no capability at all (``--cap-drop ALL``).

Two ways into a container, for two jobs:

* the node's Mininet shell and :meth:`EmulatedNetwork.popen` (probes, iperf3,
  ping, samplers) join only its network namespace and run the host's tools:
  they measure the network, which is the container's;
* trainers (:func:`trainer_prefix`) join its network *and mount* namespaces
  and its cgroups: they run the image's own ``python3`` and torch, under the
  container's CPU and memory limits, and ``docker top`` lists them.

Everything started here carries the label :data:`LABEL`; :func:`remove_all`
(called by ``testbed clean``) removes such containers, also after the builder
was killed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.model import DEFAULT_DOCKER_IMAGE

from . import naming

#: Label on every container the testbed starts (``testbed clean`` removes them by it).
LABEL = "org.geo-testbed.owner"
#: The image ``runtime: docker`` uses unless the spec names one (``testbed image build`` makes it).
DEFAULT_IMAGE = DEFAULT_DOCKER_IMAGE
#: PATH inside a container (the image's, not the venv's of the process that starts the trainer).
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What a container runs while it is a host: nothing but a long sleep (coreutils and busybox both accept it).
KEEPALIVE = ["sleep", "1000000000"]


class DockerError(RuntimeError):
    """Docker is missing, not running, or refused a container; the message names the fix."""


def container_name(node: str) -> str:
    return f"{naming.PREFIX}-{node}"


def _docker(*args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("docker") is None:
        raise DockerError("runtime: docker needs the docker CLI and a running daemon; install Debian's docker.io "
                          "(sudo WITH_DOCKER=1 scripts/bootstrap.sh) or use runtime: process")
    try:
        r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise DockerError(f"docker {args[0]} did not answer within {timeout:g} s") from e
    if check and r.returncode != 0:
        raise DockerError(f"docker {' '.join(args[:2])}: {(r.stderr or r.stdout).strip()[-500:]}")
    return r


def available() -> tuple[bool, str]:
    """Whether containers can be started here, and why not."""
    if shutil.which("docker") is None:
        return False, "no docker CLI (install Debian's docker.io: sudo WITH_DOCKER=1 scripts/bootstrap.sh)"
    try:
        r = _docker("info", "--format", "{{.ServerVersion}}", timeout=20, check=False)
    except DockerError as e:
        return False, str(e)
    if r.returncode != 0:
        return False, ("the Docker daemon is not running (start it: systemctl start docker, or dockerd &): "
                       + (r.stderr or r.stdout).strip()[-200:])
    return True, f"docker {r.stdout.strip()}"


def require() -> None:
    ok, why = available()
    if not ok:
        raise DockerError(f"runtime: docker: {why}")


def images_of(topo: Any) -> dict[str, list[str]]:
    """The images a topology's runtime: docker DCs use, each with the DCs that use it."""
    out: dict[str, list[str]] = {}
    for dc in topo.dcs:
        if dc.runtime == "docker":
            out.setdefault(dc.image or DEFAULT_IMAGE, []).append(dc.name)
    return out


def image_id(image: str) -> str | None:
    """The image's id, or None when the daemon has no such image."""
    r = _docker("image", "inspect", "--format", "{{.Id}}", image, check=False, timeout=30)
    return r.stdout.strip() if r.returncode == 0 else None


@dataclass(frozen=True)
class HostConfig:
    """What one container host gets from its DC's spec."""

    image: str
    volumes: tuple[str, ...] = ()  # "SRC:DST[:ro]"
    env: tuple[tuple[str, str], ...] = ()
    cpu: float | None = None
    memory: int | None = None
    gpus: tuple[int, ...] = ()  # device indices (testbed.network.gpus), handed over by Docker's NVIDIA runtime

    @classmethod
    def of(cls, dc: Any, cpu: float | None = None, memory: int | None = None,
           gpus: tuple[int, ...] = ()) -> HostConfig:
        """A container host's settings from its DC's spec (``image``, ``volumes``, ``env``) and what the plan
        gives the host itself.  The one place a DC becomes a container's settings: the network that starts
        it, ``net exec --container`` and a cluster launcher reading another server's all build it here."""
        return cls(dc.image or DEFAULT_IMAGE, dc.volumes, dc.env, cpu, memory, gpus)


def source_root() -> Path:
    """The project's tree (mounted read-only at the same path, so the same code runs inside)."""
    return Path(__file__).resolve().parents[2]


def run_argv(node: str, cfg: HostConfig, shared: list[Path], network: str = "none") -> list[str]:
    """``docker run`` for ``node``: detached, no capability, labelled, limited as the spec says.

    ``network``: ``none`` on an emulated network (the testbed moves veths into the container's namespace);
    ``host`` in shape mode, where a DC's hosts are its server and their traffic must leave through the
    server's own per-destination shaper (Docker refuses a hostname of its own there: the server's is kept)."""
    argv = ["run", "--detach", "--name", container_name(node),
            *(["--hostname", node] if network == "none" else []),
            "--label", f"{LABEL}={naming.PREFIX}", "--label", f"{LABEL}.node={node}",
            "--network", network, "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--volume", f"{source_root()}:{source_root()}:ro"]
    for d in shared:
        argv += ["--volume", f"{d}:{d}:rw"]
    for v in cfg.volumes:
        argv += ["--volume", v]
    for k, v in cfg.env:
        argv += ["--env", f"{k}={v}"]
    if cfg.cpu is not None:
        argv += ["--cpus", f"{cfg.cpu:g}"]
    if cfg.memory is not None:
        argv += ["--memory", str(cfg.memory), "--memory-swap", str(cfg.memory)]
    if cfg.gpus:
        from .gpus import docker_request

        argv += docker_request(cfg.gpus)
    return argv + ["--entrypoint", KEEPALIVE[0], cfg.image, *KEEPALIVE[1:]]


def start(node: str, cfg: HostConfig, shared: list[Path], network: str = "none") -> tuple[str, int]:
    """Start ``node``'s container (``network``: :func:`run_argv`); (its id, the pid of its first process in
    the host's pid namespace)."""
    if image_id(cfg.image) is None:
        raise DockerError(f"image {cfg.image!r} (for {node}) is not in the Docker daemon; build the testbed's "
                          f"with `testbed image build` or name one that exists (docker images)")
    r = _docker(*run_argv(node, cfg, shared, network), timeout=120)
    cid = r.stdout.strip().splitlines()[-1]
    state = json.loads(_docker("inspect", "--format", "{{json .State}}", cid).stdout)
    if not state.get("Running") or not state.get("Pid"):
        logs = _docker("logs", cid, check=False).stdout[-300:]
        raise DockerError(f"{node}: container {cid[:12]} of {cfg.image!r} did not keep running "
                          f"(exit {state.get('ExitCode')}; it ran {' '.join(KEEPALIVE)}): {logs}")
    return cid, int(state["Pid"])


def running_pid(node: str) -> int | None:
    """The pid of ``node``'s running container's first process (None: no such container, or not running)."""
    r = _docker("inspect", "--format", "{{.State.Pid}}", container_name(node), check=False, timeout=30)
    pid = r.stdout.strip() if r.returncode == 0 else ""
    return int(pid) if pid.isdigit() and int(pid) > 0 else None


def running_image_id(node: str) -> str | None:
    """The id of the image ``node``'s container runs (None: no such container)."""
    r = _docker("inspect", "--format", "{{.Image}}", container_name(node), check=False, timeout=30)
    return r.stdout.strip() or None if r.returncode == 0 else None


def popen_in(pid: int, cfg: HostConfig, argv: list[str], env: dict[str, str], **kw: Any) -> Any:
    """Start a trainer inside the container whose first process is ``pid``: its namespaces (so ``python3`` is
    the image's), its cgroups (its --cpus/--memory), the spec's ``env``.  ``argv[0]`` is the interpreter,
    replaced by ``python3``; the job's paths are absolute (the project's tree is mounted at its own path).
    The Popen's ``trainer_pid`` is the trainer's own pid (``nsenter``'s child); signals reach both."""
    argv = [*trainer_prefix(pid), "python3", *argv[1:]]
    kw.setdefault("preexec_fn", trainer_preexec(pid))
    kw.pop("cwd", None)
    p = subprocess.Popen(argv, env=trainer_env(env, cfg), start_new_session=True, **kw)
    p.trainer_pid = child_pid(p.pid)  # type: ignore[attr-defined]
    return signal_group(p)


def _daemon_reachable() -> bool:
    """Whether a Docker daemon answers on its socket, found without starting the docker CLI.

    ``testbed clean`` and every leftover check ask for the testbed's containers; the CLI is a large Go
    program whose start costs ~50 ms here and seconds inside the kernel lab (QEMU TCG), where no daemon
    runs at all (measured: the lab stage of ``make test`` slowed several-fold when every check started it).
    """
    if os.environ.get("GEO_TESTBED_IN_LAB") == "1":
        return False
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return True  # a TCP daemon: let the CLI find out
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(host.removeprefix("unix://"))
        except OSError:
            return False
    return True


def owned() -> list[str]:
    """Names of the testbed's containers (running or not)."""
    if shutil.which("docker") is None or not _daemon_reachable():
        return []
    try:
        r = _docker("ps", "--all", "--filter", f"label={LABEL}={naming.PREFIX}",
                    "--format", "{{.Names}}", timeout=20, check=False)
    except DockerError:
        return []
    return sorted(n for n in r.stdout.split() if n) if r.returncode == 0 else []


def remove_all() -> list[str]:
    """Remove every container the testbed started (by its label); nothing else is touched."""
    names = owned()
    if names:
        _docker("rm", "--force", "--volumes", *names, timeout=120, check=False)
    return names


def cgroup_procs(pid: int) -> list[str]:
    """The ``cgroup.procs`` files of ``pid``'s groups (v1: one per hierarchy; v2: one)."""
    out = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers:
            base = Path("/sys/fs/cgroup") / controllers.replace("name=", "")
        else:
            base = Path("/sys/fs/cgroup") if Path("/sys/fs/cgroup/cgroup.controllers").exists() else None
        if base is None:
            continue
        procs = base / path.lstrip("/") / "cgroup.procs"
        if procs.exists() and str(procs) not in out:
            out.append(str(procs))
    return out


def trainer_prefix(pid: int) -> list[str]:
    """argv prefix that runs a command in the container whose first process is ``pid``: its mount (so
    ``python3`` is the image's), network, PID, IPC and UTS namespaces, in that process's working directory.
    Give the command absolute paths: ``nsenter --wd=DIR`` would resolve DIR on the host, before entering,
    and leave the process in a directory outside the container's root (measured: torch's MKL then
    failed to load ``libtorch_cpu.so``).

    ``nsenter`` forks to enter the PID namespace and waits for its child, passing on its exit status;
    it does not pass signals on, so the caller starts it in its own session and signals the group
    (:func:`signal_group`).  Joining the PID namespace matters: without it the container's ``/proc``
    has no ``/proc/self`` for the trainer (measured: a process entered with ``mnexec -a`` could not
    read ``/proc/self/ns/mnt``)."""
    return ["nsenter", "-t", str(pid), "-m", "-n", "-p", "-i", "-u", "-w", "--"]


def signal_group(popen: Any) -> Any:
    """Make ``popen`` (started with ``start_new_session``) signal its whole group: ``nsenter`` and the
    trainer it forked inside the container's PID namespace.  Returns it."""
    import signal as _signal

    def send_signal(sig: int) -> None:
        if popen.poll() is None:
            try:
                os.killpg(popen.pid, sig)
            except ProcessLookupError:
                pass

    popen.send_signal = send_signal
    popen.terminate = lambda: send_signal(_signal.SIGTERM)
    popen.kill = lambda: send_signal(_signal.SIGKILL)
    return popen


def child_pid(pid: int, timeout: float = 5.0) -> int:
    """The process ``pid`` forked (``nsenter``'s trainer), in the host's PID namespace; ``pid`` itself when
    none appeared within ``timeout`` (it exited, or failed before forking)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return pid
        if kids:
            return int(kids[0])
        time.sleep(0.005)
    return pid


def trainer_preexec(pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` moving the new process into the container's cgroups (its --cpus/--memory apply)."""
    from .cgroups import preexec_into

    return preexec_into(cgroup_procs(pid), strict=False)


def trainer_env(env: dict[str, str], cfg: HostConfig) -> dict[str, str]:
    """The environment of a trainer in a container: the testbed's own variables and the spec's ``env``, the
    image's PATH (not the venv's), the project's tree on PYTHONPATH, and the order to drop every capability
    (``training.privileges``)."""
    keep = {k: v for k, v in env.items()
            if k.startswith(("TESTBED_", "GLOO_", "NCCL_", "OMP_", "MKL_", "PYTHONUNBUFFERED", "TORCH_", "CUDA_"))
            or k in ("LANG", "LC_ALL", "TZ")}
    keep.update({"PATH": CONTAINER_PATH, "HOME": "/root", "PYTHONPATH": str(source_root()),
                 "PYTHONDONTWRITEBYTECODE": "1",
                 # entered from the host, the trainer would hold the host's capabilities: it drops them first
                 "TESTBED_DROP_CAPS": "1"})
    keep.update(dict(cfg.env))
    return keep


#: What a container's python3 and torch are (one JSON line); an import error of torch or numpy fails it.
VERSION_PROBE = ("import json, platform, sys, numpy, torch\n"
                 "print(json.dumps({'python': platform.python_version(), 'executable': sys.executable, "
                 "'torch': torch.__version__}))")


def versions(node: str) -> dict[str, Any]:
    """The image's Python and torch as the running container reports them (recorded in the manifest)."""
    r = _docker("exec", container_name(node), "python3", "-c", VERSION_PROBE, check=False, timeout=120)
    if r.returncode != 0:
        return {"error": (r.stderr or r.stdout).strip()[-300:]}
    return json.loads(r.stdout.strip().splitlines()[-1])
