"""Stand-in servers on one machine: network namespaces on a bridge, each running its own sshd.

What a test gets is what real servers give: an address on a shared network and an SSH daemon that takes a
key the test made.  Each stand-in's sshd runs in its own network namespace and, under ``unshare``, its own
mount and PID namespaces with a private ``/run`` (so ``/run/netns`` and ``/run/geo-testbed`` are its own): a
testbed started there over SSH sees its own state, namespaces and processes, not the launcher's.  (The
launcher, in the root PID namespace, does see the stand-ins' processes: a plain ``testbed clean`` there would
end them, which no real server allows; the tests take parts down with ``net down --cluster``, remote first.)

A stand-in may be given a clock offset, a stand-in for a server whose clock is off: ``clockshift.c``, built
by the fixture and preloaded into every session through sshd's ``SetEnv``, shifts the wall clock only, as two
real servers' clocks differ.  (libfaketime, used first, also faked the monotonic clock with wall-clock values:
Python's timed waits never timed out there, so a sampler ticked twice in a trial.)  The launcher is the test's
own (root) namespace, joined to the bridge by a veth.

Names are ``tbsrv*`` (not the testbed's ``tb-`` prefix): the fixture made them and the fixture removes them,
also when a test fails; ``testbed clean`` never touches them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.conftest import REPO, fake_gpus

NET = "tbsrv-net"  # the namespace holding the servers' bridge (out of the root namespace's firewall)
SUBNET = "10.231.0"
LAUNCHER_IF = "tbsrv0"
CLOCKSHIFT_C = Path(__file__).with_name("clockshift.c")


def require() -> None:
    """Skip the calling test unless stand-ins can run here: root, sshd, a C compiler (the clock shift)."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, sshd)")
    if not os.path.exists("/usr/sbin/sshd") or shutil.which("gcc") is None:
        pytest.skip("needs openssh-server and gcc for the stand-in servers (WITH_CLUSTER=1 make bootstrap)")


def cgroup_mounts() -> str:
    """Shell commands mounting the machine's cgroup hierarchies again at their places (each followed by ``&&``).

    ``ip netns exec`` mounts a fresh sysfs for the namespace, which has nothing at ``/sys/fs/cgroup``; a real
    server has its cgroups there (Docker's daemon refuses to start without them, and hosts' CPU limits live
    there).  Mounting a v1 hierarchy with the same controllers, or cgroup2, joins the same one, not a copy."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, where, kind, opts, *_ = line.split()
        if where == "/sys/fs/cgroup" and kind == "tmpfs":
            out.append("mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup")
        elif where.startswith("/sys/fs/cgroup") and kind in ("cgroup", "cgroup2"):
            keep = ",".join(o for o in opts.split(",") if o not in ("rw", "ro", "relatime", "nosuid", "nodev", "noexec"))
            flag = f" -o {keep}" if kind == "cgroup" and keep else ""
            out.append(f"mkdir -p {where} && mount -t {kind}{flag} cgroup {where}")
    return "".join(f"{c} && " for c in out)


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=check)


@dataclass
class StandIn:
    name: str
    index: int
    clock_offset_s: float = 0.0
    netns: str = ""
    pid: int = 0
    proc: subprocess.Popen[bytes] | None = None
    extra: dict[str, str] = field(default_factory=dict)
    cores: int | None = None  # its sshd (and so all it runs) pinned to this many cores: what nproc says there
    gpus: int | None = None  # a stand-in nvidia-smi on its sessions' PATH lists this many devices
    docker: bool = False  # its own Docker daemon (own socket, data root and containerd), started over ssh

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.index + 1}"


class StandInServers:
    """``count`` stand-in servers (``s2``, ``s3``...; ``s1`` is the launcher) under ``workdir``."""

    def __init__(self, workdir: Path, count: int = 2, clock_offsets_s: tuple[float, ...] = (),
                 mtu: int = 9000, cores: tuple[int | None, ...] = (), gpus: tuple[int | None, ...] = (),
                 docker: bool = False) -> None:
        self.workdir = workdir
        self.mtu = mtu  # the servers' network (jumbo frames: a 1500-byte WAN link fits a VXLAN tunnel)
        self.servers = [StandIn(f"s{i + 2}", i + 1, clock_offsets_s[i] if i < len(clock_offsets_s) else 0.0,
                                cores=cores[i] if i < len(cores) else None, gpus=gpus[i] if i < len(gpus) else None,
                                docker=docker)
                        for i in range(count)]
        self.key = workdir / "id_ed25519"
        self.known_hosts = workdir / "known_hosts"

    # ------------------------------------------------------------ set-up
    def start(self) -> StandInServers:
        try:
            self._network()
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "testbed-standin", "-f", str(self.key))
            for s in self.servers:
                self._sshd(s)
            self._wait()
            for s in self.servers:
                if s.docker:
                    self._dockerd(s)
        except BaseException:
            self.stop()
            raise
        return self

    def _network(self) -> None:
        self.stop_network()
        sh("ip", "netns", "add", NET)
        sh("ip", "-n", NET, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", NET, "link", "set", "br0", "up")
        sh("ip", "link", "add", LAUNCHER_IF, "type", "veth", "peer", "name", "l0", "netns", NET)
        sh("ip", "-n", NET, "link", "set", "l0", "mtu", str(self.mtu), "master", "br0", "up")
        sh("ip", "link", "set", LAUNCHER_IF, "mtu", str(self.mtu))
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", LAUNCHER_IF)
        sh("ip", "link", "set", LAUNCHER_IF, "up")
        for s in self.servers:
            s.netns = f"tbsrv-{s.name}"
            sh("ip", "netns", "add", s.netns)
            sh("ip", "-n", s.netns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{s.index}",
               "netns", NET)
            sh("ip", "-n", NET, "link", "set", f"p{s.index}", "mtu", str(self.mtu), "master", "br0", "up")
            sh("ip", "-n", s.netns, "link", "set", "eth0", "mtu", str(self.mtu))
            sh("ip", "-n", s.netns, "addr", "add", f"{s.address}/24", "dev", "eth0")
            sh("ip", "-n", s.netns, "link", "set", "eth0", "up")
            sh("ip", "-n", s.netns, "link", "set", "lo", "up")

    def clockshift(self) -> Path:
        """The clock-shift library (``clockshift.c``), built once into the work directory."""
        lib = self.workdir / "clockshift.so"
        if not lib.exists():
            sh("gcc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(CLOCKSHIFT_C), "-ldl")
        return lib

    def _sshd(self, s: StandIn) -> None:
        d = self.workdir / s.name
        d.mkdir()
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
        shutil.copy(f"{self.key}.pub", d / "authorized_keys")
        env = f"TESTBED_STANDIN={s.name}"
        if s.clock_offset_s:
            env += f" LD_PRELOAD={self.clockshift()} TESTBED_CLOCK_OFFSET_NS={round(s.clock_offset_s * 1e9)}"
        if s.gpus is not None:
            env += f" PATH={fake_gpus(d / 'bin', s.gpus)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        (d / "sshd_config").write_text(
            f"ListenAddress {s.address}\nPort 22\nHostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
            f"PidFile none\nStrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
            f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nSetEnv {env}\n"
            f"MaxSessions 64\nMaxStartups 64\n")
        self._launch(s)
        # pin the host key for the client
        pub = (d / "host_key.pub").read_text().split()
        with open(self.known_hosts, "a") as f:
            f.write(f"{s.address} {pub[0]} {pub[1]}\n")

    def _launch(self, s: StandIn) -> None:
        """Start the stand-in's sshd (its config made by ``_sshd``)."""
        d = self.workdir / s.name
        # own mount + PID namespaces, with private run-time directories: the server's own view
        # /run as a whole, not only its testbed directories: a directory mounted over in another mount
        # namespace is detached when the launcher removes it (rmdir), which would merge the two views
        inner = ("mount --make-rprivate / && mount -t tmpfs tbsrv /run && mkdir -p /run/netns /run/sshd && "
                 f"{cgroup_mounts()}exec /usr/sbin/sshd -D -e -f {d}/sshd_config")
        pin = ["taskset", "-c", f"0-{s.cores - 1}"] if s.cores else []
        with open(d / "sshd.log", "ab") as log:
            s.proc = subprocess.Popen([*pin, "ip", "netns", "exec", s.netns, "unshare", "--mount", "--pid", "--fork",
                                       "--mount-proc", "sh", "-c", inner], stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        s.pid = s.proc.pid

    def restart_sshd(self, name: str) -> None:
        """A server that disappeared comes back: a fresh sshd in fresh mount and PID namespaces (what ran there
        before went with the old ones, as with a reboot; its network namespace and address stay)."""
        s = next(s for s in self.servers if s.name == name)
        self.kill_sshd(name)
        # the old PID namespace's processes die asynchronously, and while one holds the listening socket the
        # new sshd's bind fails ("Address already in use"): start it again until it binds
        deadline = time.monotonic() + 30
        while True:
            self._launch(s)
            time.sleep(0.5)
            if s.proc is not None and s.proc.poll() is None:
                break
            assert time.monotonic() < deadline, (self.workdir / s.name / "sshd.log").read_text()[-500:]
        self._wait()

    def docker_root(self, s: StandIn) -> Path:
        # on the disk, not under /tmp: an image loaded there is GBs (the test's work directory may be a tmpfs)
        return Path(f"/var/tmp/tbsrv-docker-{s.name}")

    def _dockerd(self, s: StandIn) -> None:
        """The stand-in's own Docker daemon, started over ssh as a server's admin would: its socket, pid file,
        exec root and managed containerd in the stand-in's private /run, its data root its own (no image the
        launcher's daemon has is there).  No bridge or iptables rules: the testbed's containers use
        ``--network none``.  It goes with the stand-in's PID namespace."""
        root = self.docker_root(s)
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        log = self.workdir / s.name / "dockerd.log"
        cmd = (f"setsid nohup dockerd --data-root {root} --exec-root /run/docker --pidfile /run/docker.pid "
               f"--host unix:///var/run/docker.sock --bridge none --iptables=false --ip-masq=false "
               f"> {log} 2>&1 < /dev/null &")
        r = subprocess.run(["ssh", *self.ssh_options(), f"root@{s.address}", cmd], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 60
        while True:
            r = subprocess.run(["ssh", *self.ssh_options(), f"root@{s.address}", "docker info --format '{{.ID}}'"],
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"dockerd of {s.name} does not answer: {log.read_text()[-1000:]}")
            time.sleep(0.5)

    def _wait(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for s in self.servers:
            while True:
                r = subprocess.run(["ssh", *self.ssh_options(), f"root@{s.address}", "true"], capture_output=True,
                                   text=True, timeout=15)
                if r.returncode == 0:
                    break
                if s.proc is not None and s.proc.poll() is not None:
                    raise RuntimeError(f"sshd of {s.name} exited: {(self.workdir / s.name / 'sshd.log').read_text()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd of {s.name} does not answer: {r.stderr}")
                time.sleep(0.2)

    def ssh_options(self) -> list[str]:
        return ["-i", str(self.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes"]

    # ------------------------------------------------------------ the cluster file
    def cluster(self, **extra: object) -> dict[str, object]:
        servers = [{"name": "s1", "address": f"{SUBNET}.1"}]
        servers += [{"name": s.name, "address": s.address, "identity": str(self.key), "python": sys.executable}
                    for s in self.servers]
        return {"servers": servers, "known_hosts": str(self.known_hosts), "connect_timeout": 5, **extra}

    def kill_sshd(self, name: str) -> None:
        s = next(s for s in self.servers if s.name == name)
        if s.proc is not None and s.proc.poll() is None:
            os.killpg(s.proc.pid, signal.SIGKILL)
            s.proc.wait()

    # ------------------------------------------------------------ tear-down
    def stop(self) -> None:
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                try:
                    os.killpg(s.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                s.proc.wait()
        self.stop_network()
        for s in self.servers:
            if s.docker:  # its daemon and its containers went with its PID and mount namespaces
                shutil.rmtree(self.docker_root(s), ignore_errors=True)

    @staticmethod
    def stop_network() -> None:
        # a PID namespace's processes die with its init (unshare's child), so killing the group is enough;
        # whatever the namespaces still hold goes with them
        for ns in sh("ip", "netns", "list", check=False).stdout.split("\n"):
            name = ns.split(" ")[0]
            if name.startswith("tbsrv-"):
                sh("ip", "netns", "pids", name, check=False)
                for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                sh("ip", "netns", "del", name, check=False)
        sh("ip", "link", "del", LAUNCHER_IF, check=False)


# ---------------------------------------------------------------- what tests ask of a stand-in (over ssh)
def write(d, spec, name="cluster.yaml"):
    f = d / name
    f.write_text(yaml.safe_dump(spec, sort_keys=False))
    return f


def run_trials(spec: Path, cluster: Path, results: Path, count: int, timeout: float) -> list[tuple[Path, dict]]:
    """``testbed run SPEC --cluster FILE`` as a user runs it (a separate process); each trial's directory and
    manifest, every one asserted ok."""
    from tests.conftest import run_cli

    r = run_cli("run", str(spec), "--cluster", str(cluster), "--results", str(results), "--json", timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    trials = [Path(t["dir"]) for t in json.loads(r.stdout)["trials"]]
    assert len(trials) == count, trials
    out = []
    for trial in trials:
        m = json.loads((trial / "manifest.json").read_text())
        assert m["status"] == "ok", m["reason"]
        out.append((trial, m))
    return out


def on_s2(standins, cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A shell command on the stand-in, over ssh (as the testbed reaches it)."""
    return subprocess.run(["ssh", *standins.ssh_options(), f"root@{standins.servers[0].address}", cmd],
                          capture_output=True, text=True, timeout=timeout)


def s2_testbed(standins, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return on_s2(standins, f"cd {shlex.quote(str(REPO))} && {shlex.quote(sys.executable)} -m testbed.cli "
                 + shlex.join(args), timeout)


def kill_cli_when(standins, args: list[str], ready_cmd: str, ready_text: str, what: str,
                  timeout: float = 300, every_s: float = 0.05) -> None:
    """Start ``testbed ARGS`` in a session of its own; once ``ready_cmd`` on the stand-in prints ``ready_text``,
    SIGKILL the whole session, as a launcher dies (``what``: what never got ready, for the failure)."""
    from tests.conftest import cli_env

    p = subprocess.Popen([sys.executable, "-m", "testbed.cli", *args], cwd=REPO, env=cli_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + timeout
    while ready_text not in on_s2(standins, ready_cmd).stdout:
        assert p.poll() is None, p.stderr.read() if p.stderr else ""
        assert time.monotonic() < deadline, what
        time.sleep(every_s)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()


def verify_failures(r: subprocess.CompletedProcess[str], out: dict) -> str:
    """What a failed ``net verify --json`` names: every check that did not pass, then the end of its stderr."""
    bad = [f"{c['kind']} {c['subject']}: {c['status']} measured={c.get('measured')} expected={c.get('expected')} "
           f"({c.get('tolerance')}) {json.dumps(c.get('extra') or {})[:400]}"
           for c in out.get("checks", []) if c.get("status") == "fail"]
    return "\n".join(["checks not passed:", *bad, "stderr:", r.stderr[-2000:]])


def min_rtt_ms(text: str) -> float:
    m = re.search(r"= ([\d.]+)/", text)
    assert m, text
    return float(m.group(1))


def s2_state(standins) -> dict[str, list[str]]:
    r = on_s2(standins, f"cd {shlex.quote(str(REPO))} && {shlex.quote(sys.executable)} -c "
                        "'import json; from testbed.network.cleanup import leftovers; print(json.dumps(leftovers()))'")
    assert r.returncode == 0, r.stderr
    return {k: v for k, v in json.loads(r.stdout).items() if v}


def local_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(ln.split()[0] for ln in out.splitlines() if ln.startswith("tb-"))


# ---------------------------------------------------------------- a line of three DCs on two servers
#: a on the launcher (s1); b and c on the stand-in (s2).  a-b crosses servers (a tunnel), b-c does not: the
#: same shape on both, so the tunnel is held against a same-server link
LINE = {"name": "line3", "defaults": {"hosts": 1, "lan": {"rate": "1Gbit"}},
        "dcs": ["a", "b", "c"],
        "links": [{"a": "a", "b": "b", "rate": "50Mbit", "delay": "5ms"},
                  {"a": "b", "b": "c", "rate": "50Mbit", "delay": "5ms"}]}
PLACEMENT = {"a": "s1", "b": "s2", "c": "s2"}


def running(workdir: Path, count: int = 1, **kw: object):
    """A module's stand-ins (a pytest fixture's body: ``yield from running(...)``): skipped where they cannot
    run; at the end every server's testbed is taken down over ssh, then the stand-ins go."""
    from tests.conftest import run_cli

    require()
    s = StandInServers(workdir, count, **kw).start()  # type: ignore[arg-type]
    try:
        yield s
    finally:
        run_cli("net", "down", "--cluster", str(write(s.workdir, s.cluster())), timeout=120)
        s.stop()
