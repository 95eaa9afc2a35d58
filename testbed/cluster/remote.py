"""Commands on a server over OpenSSH, and nothing else.

Every server but the launcher is reached only through ``ssh`` (the client the OS ships), never by a shared
process or namespace, so what works in the tests works on real servers.  One master connection per server
(``ControlMaster``) is opened on first use and shared by every later command, so a command costs a channel,
not a handshake; :meth:`Remote.close` (or leaving the ``with`` block) ends it.

Options that make failures prompt and clear: ``BatchMode`` (never a password prompt), ``ConnectTimeout``,
``ServerAlive*`` (a server that disappears is noticed within ~15 s), ``StrictHostKeyChecking=accept-new``
unless the user's ssh configuration says otherwise (a new server's key is recorded, a changed one refused).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .model import Cluster, Server

SSH = "ssh"
#: ssh's exit status when the connection itself failed (not the remote command)
SSH_FAILED = 255


class RemoteError(RuntimeError):
    """A server could not be reached, or a command on it failed; says which server and what to do."""

    def __init__(self, server: Server, problem: str, fix: str = "") -> None:
        self.server = server.name
        self.problem = problem
        self.fix = fix
        super().__init__(f"server {server.name} ({server.target}:{server.port}): {problem}"
                         + (f" (fix: {fix})" if fix else ""))


class Remote:
    """One server, reached over SSH with a shared master connection."""

    def __init__(self, server: Server, cluster: Cluster | None = None, control_dir: str | Path | None = None) -> None:
        self.server = server
        self.known_hosts = cluster.known_hosts if cluster else None
        self.connect_timeout = cluster.connect_timeout if cluster else 10.0
        self._own_dir = control_dir is None
        self.control_dir = Path(control_dir or tempfile.mkdtemp(prefix="testbed-ssh-"))

    # ---------------------------------------------------------------- ssh
    def ssh_args(self, shared: bool = True) -> list[str]:
        """``shared=False``: a connection of its own, not through the master (a long-lived command whose life
        must not hang on the master's: a trainer, a measurement's server process)."""
        s = self.server
        mux = (["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C", "-o", "ControlPersist=120"]
               if shared else ["-o", "ControlMaster=no", "-o", "ControlPath=none"])
        args = [SSH, "-p", str(s.port), "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(self.connect_timeout)}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", *mux,
                "-o", "StrictHostKeyChecking=accept-new", "-o", "LogLevel=ERROR"]
        if s.identity:
            args += ["-i", s.identity, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            args += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        return args + [s.target]

    def command(self, argv: list[str] | str, shared: bool = True) -> list[str]:
        """The ssh command line that runs ``argv`` (a list is quoted for the remote shell)."""
        remote = argv if isinstance(argv, str) else shlex.join(argv)
        return self.ssh_args(shared) + ["--", remote]

    def run(self, argv: list[str] | str, *, timeout: float = 60.0, input: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command on the server; RemoteError when it cannot be reached (or, with ``check``, fails)."""
        try:
            cp = subprocess.run(self.command(argv), input=input, capture_output=True, text=True, timeout=timeout,
                                stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise RemoteError(self.server, f"no answer within {timeout:.0f} s to {_short(argv)}",
                              "check that the server is up and not overloaded") from None
        if cp.returncode == SSH_FAILED:
            raise RemoteError(self.server, f"ssh failed: {_last_line(cp.stderr) or 'connection refused or lost'}",
                              _ssh_fix(cp.stderr))
        if check and cp.returncode != 0:
            raise RemoteError(self.server, f"{_short(argv)} exited {cp.returncode}: {_last_line(cp.stderr)}",
                              "run it by hand on the server to see why")
        return cp

    def read(self, argv: list[str] | str, *, timeout: float = 600.0) -> bytes:
        """A command's stdout as bytes (an archive, say); RemoteError when it cannot run or fails."""
        try:
            cp = subprocess.run(self.command(argv), capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise RemoteError(self.server, f"no answer within {timeout:.0f} s to {_short(argv)}",
                              "check that the server is up and not overloaded") from None
        err = cp.stderr.decode(errors="replace")
        if cp.returncode == SSH_FAILED:
            raise RemoteError(self.server, f"ssh failed: {_last_line(err) or 'connection refused or lost'}",
                              _ssh_fix(err))
        if cp.returncode != 0:
            raise RemoteError(self.server, f"{_short(argv)} exited {cp.returncode}: {_last_line(err)}",
                              "run it by hand on the server to see why")
        return cp.stdout

    def popen(self, argv: list[str] | str, **kw: Any) -> subprocess.Popen[str]:
        """A long-lived command on the server (its stdin/stdout piped unless ``kw`` says otherwise)."""
        kw.setdefault("stdin", subprocess.PIPE)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(self.command(argv), text=True, bufsize=1, **kw)

    def close(self) -> None:
        """End the master connection and remove its socket directory."""
        subprocess.run(self.ssh_args()[:-1] + ["-O", "exit", self.server.target], capture_output=True, timeout=10)
        if self._own_dir:  # a master another thread started meanwhile may have left its socket: removed too
            shutil.rmtree(self.control_dir, ignore_errors=True)

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _short(argv: list[str] | str) -> str:
    text = argv if isinstance(argv, str) else shlex.join(argv)
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _ssh_fix(stderr: str) -> str:
    low = (stderr or "").lower()
    if "permission denied" in low:
        return "give the server your public key (ssh-copy-id), or name identity: in the cluster file"
    if "host key verification failed" in low or "remote host identification has changed" in low:
        return "the server's host key changed: check it, then remove its old line from known_hosts"
    if "could not resolve" in low:
        return "check the server's address: in the cluster file"
    return "check the server's address and port, and that sshd runs there (ssh -p PORT USER@ADDRESS true)"
