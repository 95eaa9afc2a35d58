"""Boot the lab VM, run one command in it, and always power it off.

Why QEMU with TCG: this machine's kernel lacks ``sch_netem`` and its
``/dev/kvm`` is not usable with a stock kernel, so a software-emulated VM
running the distribution's own kernel is the one way to get netem here.  TCG
is slow for compute but fine for network behaviour (see docs/DESIGN.md).

The guest sees the host's root read-only over 9p (so the lab runs exactly the
code in the working tree) plus writable 9p shares: a private control
directory (``stage2.sh``, the exit status, ``LAB_OUT``) and any directory the
caller lists.  Kernel messages go to ``ttyS0`` (kept as the console log, used
to explain panics); the command's output goes to ``ttyS1``, which is QEMU's
stdout here and is streamed to the caller.

QEMU runs in its own session so a terminal's Ctrl-C reaches only us; we kill
it on every way out (normal end, timeout, SIGINT/SIGTERM/SIGHUP, exceptions),
and ``PR_SET_PDEATHSIG`` kills it even if this process is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NoReturn

from testbed.lab.errors import (
    TIMEOUT_STATUS,
    GuestPanic,
    GuestSetupFailed,
    LabError,
    LabInterrupted,
    QemuMissing,
)
from testbed.lab.guest import TESTBED_MODULES, Share, guest_env, masked_by_tmpfs, stage2_script
from testbed.lab.initramfs import build_initramfs
from testbed.lab.kernel import Log, _quiet, cache_root, cached_trees, ensure_kernel, find_tool
from testbed.lab.stream import ConsoleSplitter
from traffic_control.errors import ValidationError

QEMU = "qemu-system-x86_64"
CTL_PREFIX = "geo-lab-"
DEFAULT_MEMORY_MB = 2048
DEFAULT_CPUS = 1
#: Kernel command line.  panic=-1 + QEMU's -no-reboot turn a panic into a
#: prompt QEMU exit; tsc=reliable keeps the TSC clocksource (the fallbacks are
#: far slower to read under TCG); mitigations=off saves emulated cycles.
KERNEL_CMDLINE = (
    "console=ttyS0 panic=-1 quiet loglevel=1 rdinit=/init "
    "tsc=reliable mitigations=off random.trust_cpu=on"
)
#: Host root options: the root cannot change under a running lab in a way the
#: tests care about, so the guest may cache it aggressively (big win under TCG).
ROOT_CACHE_OPTS = "cache=loose"


@dataclass
class LabResult:
    """What a lab run produced."""

    returncode: int
    output: str
    boot_s: float  # QEMU start -> command start (kernel, init, mounts, modules)
    run_s: float  # command start -> command end (or kill)
    timed_out: bool = False
    console: str = ""  # the guest kernel's console log (ttyS0)
    module_errors: str = ""  # kmod's complaints, when keep_going let the run continue
    argv: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While the VM runs, SIGTERM/SIGHUP unwind the stack like Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise LabInterrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _die_with_parent() -> None:
    """Runs in the child before exec: QEMU gets SIGKILL when we die."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def lab_available() -> tuple[bool, str]:
    """Whether this host can run the lab, without downloading or booting anything."""
    if shutil.which(QEMU) is None:
        return False, f"{QEMU} not found (sudo scripts/bootstrap.sh installs qemu-system-x86)"
    for tool, pkg in (("busybox", "busybox-static"), ("depmod", "kmod"), ("modprobe", "kmod")):
        if find_tool(tool) is None:
            return False, f"{tool} not found (sudo scripts/bootstrap.sh installs {pkg})"
    if not cached_trees(cache_root()) and (find_tool("apt-get") is None or find_tool("dpkg-deb") is None):
        return False, "no cached kernel and no apt-get/dpkg-deb to fetch one"
    return True, "qemu, busybox and kmod present; kernel " + (
        "cached" if cached_trees(cache_root()) else "will be downloaded on first use")


def _validate(argv: Sequence[str], timeout: float, memory_mb: int, cpus: int,
              cwd: Path, shares: Sequence[Path]) -> None:
    if not argv:
        raise ValidationError("command", "no command given", "testbed lab -- CMD [ARGS...]")
    if not timeout > 0:
        raise ValidationError("timeout", f"must be > 0 seconds, got {timeout}", "e.g. --timeout 600")
    if memory_mb < 256:
        raise ValidationError("memory", f"{memory_mb} MB is too little for the guest", "use at least 256")
    host_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    if memory_mb > host_mb:
        raise ValidationError("memory", f"{memory_mb} MB is more than this host has ({host_mb} MB)",
                              f"use at most {host_mb}")
    if cpus < 1:
        raise ValidationError("cpus", f"must be >= 1, got {cpus}", "e.g. --cpus 1")
    if not cwd.is_absolute() or not cwd.is_dir():
        raise ValidationError("cwd", f"{cwd} is not an existing absolute directory", "cd somewhere real")
    for i, s in enumerate(shares):
        if not s.is_absolute() or not s.is_dir():
            raise ValidationError(f"shares[{i}]", f"{s} is not an existing absolute directory",
                                  "create it first and pass an absolute path")


def qemu_argv(*, kernel: Path, initrd: Path, ctl: Path, console_log: Path,
              shares: Sequence[Share], memory_mb: int, cpus: int) -> list[str]:
    """The QEMU command line (separate so tests and docs can show it)."""
    argv = [
        QEMU, "-accel", "tcg", "-cpu", "max", "-m", str(memory_mb), "-smp", str(cpus),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-nic", "none",
        "-kernel", str(kernel), "-initrd", str(initrd), "-append", KERNEL_CMDLINE,
        "-serial", f"file:{console_log}",
        "-chardev", "stdio,id=cmdout,signal=off", "-serial", "chardev:cmdout",
        "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
        "-virtfs", f"local,path={ctl},mount_tag=labctl,security_model=none,multidevs=remap",
    ]
    for share in shares:
        ro = ",readonly=on" if share.readonly else ""
        argv += ["-virtfs", f"local,path={share.path},mount_tag={share.tag},security_model=none{ro},multidevs=remap"]
    return argv


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Power the VM off for good: SIGKILL to QEMU's process group, at once.

    Nothing in the VM needs a clean shutdown (its root is the host's,
    read-only; its tmpfs is thrown away; what it wrote to shared directories
    went through 9p synchronously), and on a loaded machine a SIGTERM,
    a grace period and then SIGKILL took long enough for a Ctrl-C to miss its
    deadline.  A VM that powered itself off is already gone.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _pump(proc: subprocess.Popen[bytes], splitter: ConsoleSplitter) -> None:
    """Reader thread: move QEMU's stdout (guest ttyS1) into the splitter."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        splitter.feed(chunk)


def _warn_hidden_paths(argv: Sequence[str], shares: Sequence[Path], log: Log) -> None:
    """Say so when an argument names a host file the guest's tmpfs will hide."""
    for arg in argv:
        p = Path(arg)
        if (p.is_absolute() and p.exists() and masked_by_tmpfs(p)
                and not any(s == p or s in p.parents for s in shares)):
            log(f"warning: {arg} is under a directory the guest covers with tmpfs; "
                f"share it (--share {p.parent}) or the command will not find it")


def _reap_stale_ctl_dirs(base: Path) -> None:
    """Remove control dirs left by labs whose owner was SIGKILLed.

    Only directories carrying our ``owner`` file are candidates, and only when
    that process is gone, so a lab running in parallel keeps its directory.
    """
    for d in base.glob(f"{CTL_PREFIX}*"):
        try:
            pid = int((d / "owner").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def run_in_lab(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    shares: Sequence[str | os.PathLike[str]] = (),
    out_dir: str | os.PathLike[str] | None = None,
    memory_mb: int = DEFAULT_MEMORY_MB,
    cpus: int = DEFAULT_CPUS,
    keep_going: bool = False,
    modules: Sequence[str] | None = None,
    stream: BinaryIO | None = None,
    log: Log = _quiet,
) -> LabResult:
    """Run ``argv`` as root in the host's userland on the lab kernel.

    ``timeout`` counts from QEMU's start (boot included); on expiry the VM is
    killed and the result has ``timed_out`` and status 124.  ``env`` adds to
    the essentials :func:`testbed.lab.guest.guest_env` passes.  ``shares`` are
    host directories the guest may write, mounted at the same path; ``out_dir``
    (shared the same way) becomes ``$LAB_OUT``, else ``$LAB_OUT`` is a scratch
    directory dropped after the run.  ``keep_going`` runs the command even if
    some modules fail to load.  Output is streamed to ``stream`` as it comes.

    Raises ValidationError for bad arguments and LabError (with a ``fix``) when
    the lab itself fails: no qemu, no kernel, a guest panic, a failed setup.
    """
    cwd_p = Path(cwd or os.getcwd()).absolute()
    share_ps = [Path(s).absolute() for s in shares]
    out_p = Path(out_dir).absolute() if out_dir is not None else None
    if out_p is not None:
        out_p.mkdir(parents=True, exist_ok=True)
        share_ps.append(out_p)
    _validate(argv, timeout, memory_mb, cpus, cwd_p, share_ps)
    if masked_by_tmpfs(cwd_p) and not any(s == cwd_p or s in cwd_p.parents for s in share_ps):
        share_ps.append(cwd_p)  # else the guest's tmpfs would hide it
    if shutil.which(QEMU) is None:
        raise QemuMissing(f"{QEMU} not found", "sudo scripts/bootstrap.sh (it installs qemu-system-x86)")

    _warn_hidden_paths(argv, share_ps, log)
    with _signals_raise():
        cache = cache_root()
        tree = ensure_kernel(cache, log=log)
        initrd = build_initramfs(tree, cache)
        _reap_stale_ctl_dirs(Path(tempfile.gettempdir()))
        ctl = Path(tempfile.mkdtemp(prefix=CTL_PREFIX))
        try:
            (ctl / "owner").write_text(f"{os.getpid()}\n")
            return _boot_and_run(list(argv), tree_root=tree.root, kernel=tree.boot_image, initrd=initrd,
                                 ctl=ctl, cwd=cwd_p, env=env, shares=share_ps, out_dir=out_p,
                                 timeout=timeout, memory_mb=memory_mb, cpus=cpus,
                                 keep_going=keep_going, modules=modules, stream=stream, log=log)
        finally:
            shutil.rmtree(ctl, ignore_errors=True)


def _boot_and_run(argv: list[str], *, tree_root: Path, kernel: Path, initrd: Path, ctl: Path,
                  cwd: Path, env: Mapping[str, str] | None, shares: list[Path],
                  out_dir: Path | None, timeout: float, memory_mb: int, cpus: int,
                  keep_going: bool, modules: Sequence[str] | None, stream: BinaryIO | None,
                  log: Log) -> LabResult:
    token = secrets.token_hex(8)
    tagged = [Share(f"share{i}", p) for i, p in enumerate(shares)]
    if masked_by_tmpfs(tree_root):  # a kernel cache under /tmp: modprobe must still see it
        tagged.append(Share("kernel", tree_root, readonly=True))
    genv = guest_env(ctl, env)
    if out_dir is not None:
        genv["LAB_OUT"] = str(out_dir)
    (ctl / "path").write_text(str(ctl) + "\n")
    (ctl / "rootopts").write_text(ROOT_CACHE_OPTS + "\n")
    (ctl / "stage2.sh").write_text(stage2_script(
        ctl=ctl, token=token, argv=argv, cwd=cwd, env=genv, shares=tagged, tree_root=tree_root,
        modules=list(modules) if modules is not None else TESTBED_MODULES, keep_going=keep_going))
    console_log = ctl / "console.log"
    qargv = qemu_argv(kernel=kernel, initrd=initrd, ctl=ctl, console_log=console_log,
                      shares=tagged, memory_mb=memory_mb, cpus=cpus)
    splitter = ConsoleSplitter(token, stream)
    timed_out = False
    log(f"booting {kernel.name} ({cpus} vCPU, {memory_mb} MB, TCG)")
    with open(ctl / "qemu.err", "wb") as qerr:
        t0 = time.monotonic()
        proc = subprocess.Popen(qargv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=qerr, start_new_session=True, preexec_fn=_die_with_parent)
        reader = threading.Thread(target=_pump, args=(proc, splitter), daemon=True)
        try:
            reader.start()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
        finally:
            _stop(proc)
            reader.join(timeout=10)
            splitter.finish()
        t_end = time.monotonic()
    console = _read(console_log)
    ready = splitter.ready_at
    done = splitter.done_at or t_end
    boot_s = (ready - t0) if ready is not None else t_end - t0
    run_s = (done - ready) if ready is not None else 0.0
    output = bytes(splitter.output).decode(errors="replace")
    mod_err = _read(ctl / "modules.err") if _read(ctl / "modules.rc") not in ("", "0") else ""
    if timed_out:
        where = "booting" if ready is None else "running the command"
        log(f"timed out after {timeout:g} s while {where}; VM killed")
        return LabResult(TIMEOUT_STATUS, output, boot_s, run_s, True, console, mod_err, argv)
    status = _read(ctl / "status")
    if status.isdigit():
        rc = int(status)
    elif splitter.done_status is not None:
        rc = splitter.done_status
    else:
        _explain_failure(ctl, splitter.boot_text.decode(errors="replace"), console, mod_err,
                         proc.returncode)
    if mod_err:
        log(f"some modules did not load: {_tail(mod_err, 5)}")
    log(f"boot {boot_s:.1f} s, command {run_s:.1f} s, exit status {rc}")
    return LabResult(rc, output, boot_s, run_s, False, console, mod_err, argv)


def _read(path: Path) -> str:
    """A control file's text, stripped; empty when the guest never wrote it."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _explain_failure(ctl: Path, boot_text: str, console: str, mod_err: str, qemu_rc: int | None) -> NoReturn:
    """The VM ended without an exit status: raise the most precise error we can."""
    setup_err = _read(ctl / "setup.err")
    stage2_log = _read(ctl / "stage2.log")
    qemu_err = _read(ctl / "qemu.err")
    if setup_err:
        detail = "\n".join(x for x in (mod_err, stage2_log) if x)
        missing = re.findall(r"Module (\S+) not found|could not insert '([^']+)'", mod_err)
        names = [a or b for a, b in missing]
        what = f" ({', '.join(names)})" if names else ""
        raise GuestSetupFailed(f"lab setup failed: {setup_err.splitlines()[0]}{what}",
                               "pass --keep-going to run anyway without the missing modules"
                               if mod_err else "see the details below", _tail(detail, 10))
    if "GEO-LAB-INIT-FAILED" in boot_text:
        why = boot_text.split("GEO-LAB-INIT-FAILED:", 1)[1].strip().splitlines()[0]
        raise GuestSetupFailed(f"lab init failed: {why}", "check that the kernel package has 9p "
                               "and virtio modules", _tail(console))
    if "Kernel panic" in console:
        lines = console.splitlines()
        at = next(i for i, ln in enumerate(lines) if "Kernel panic" in ln)
        raise GuestPanic(f"guest kernel panicked: {lines[at].strip()}",
                         "see the console log below; rerun to rule out a one-off",
                         "\n".join(lines[max(0, at - 5): at + 25]))
    if qemu_err and qemu_rc not in (0, None):
        raise LabError(f"qemu failed (status {qemu_rc}): {_tail(qemu_err, 3)}",
                       "see qemu's message; check --memory/--cpus and the qemu-system-x86 package",
                       qemu_err)
    raise GuestPanic("the VM stopped before the command finished",
                     "see the console log below", _tail(console + "\n" + stage2_log))
