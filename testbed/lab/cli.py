"""``testbed lab``: run a command on a stock kernel with netem, under QEMU.

Plug-in for the top-level parser (``register(subparsers)``, see
docs/CONTRACTS.md).  Exit status: the command's own, 124 when the time limit
killed it, 125 when the lab itself failed (message on stderr says why and how
to fix it), 2 for bad arguments, 128+N when stopped by signal N.
"""

from __future__ import annotations

import argparse
import signal
import sys

from testbed.lab.errors import LAB_FAILURE_STATUS, LabError, LabInterrupted
from testbed.lab.guest import TESTBED_MODULES
from testbed.lab.kernel import cache_root, ensure_kernel, stderr_log
from testbed.lab.vm import DEFAULT_CPUS, DEFAULT_MEMORY_MB, lab_available, run_in_lab
from traffic_control.errors import ValidationError

EPILOG = """\
The guest runs the host's own userland (read-only, over 9p) on the
distribution's kernel package, which is downloaded once into the cache
(GEO_TESTBED_LAB_CACHE, default /var/cache/geo-testbed/lab) and never
installed.  /tmp, /run, /var/tmp and /dev/shm are fresh tmpfs in the guest:
pass --share DIR for host directories the command must read from there or
write to.  $LAB_OUT (--out) is a writable directory kept after the run.

examples:
  testbed lab -- tc qdisc add dev lo root netem delay 10ms
  testbed lab --timeout 900 -- .venv/bin/python -m pytest -m netem -p no:cacheprovider tests
"""


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``lab`` subcommand."""
    p = subparsers.add_parser(
        "lab", help="run a command on a stock kernel with netem (QEMU, TCG)",
        description=__doc__.split("\n\n")[0], epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="kill the VM after S seconds, boot included (default 600); status 124")
    p.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MB, metavar="MB",
                   help=f"guest memory (default {DEFAULT_MEMORY_MB})")
    p.add_argument("--cpus", type=int, default=DEFAULT_CPUS, metavar="N",
                   help=f"guest vCPUs, each a busy host thread under TCG (default {DEFAULT_CPUS})")
    p.add_argument("--keep-going", action="store_true",
                   help="run the command even if some kernel modules fail to load")
    p.add_argument("--share", action="append", default=[], metavar="DIR",
                   help="host directory the guest may write, at the same path (repeatable)")
    p.add_argument("--out", metavar="DIR", help="writable directory exported as $LAB_OUT")
    p.add_argument("--module", action="append", default=None, metavar="NAME",
                   help="load this module too, besides the testbed's set (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no 'lab:' progress lines on stderr")
    p.add_argument("--prepare", action="store_true",
                   help="only download/unpack the kernel and build the initramfs (no boot)")
    p.add_argument("--check", action="store_true",
                   help="say whether this host can run the lab; exit 0 if so, 1 if not")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=run_lab_command)


def run_lab_command(args: argparse.Namespace) -> int:
    """Entry point of ``testbed lab``; returns the exit status."""
    log = (lambda _m: None) if args.quiet else stderr_log
    if args.check:
        ok, why = lab_available()
        print(f"lab: {'available' if ok else 'unavailable'}: {why}")
        return 0 if ok else 1
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    # The VM is torn down in finally blocks; make SIGTERM unwind like Ctrl-C.
    try:
        if args.prepare:
            from testbed.lab.initramfs import build_initramfs

            tree = ensure_kernel(log=log)
            image = build_initramfs(tree, cache_root())
            print(f"kernel {tree.kver}: {tree.boot_image}\ninitramfs: {image}")
            return 0
        result = run_in_lab(
            command, timeout=args.timeout, memory_mb=args.memory, cpus=args.cpus,
            keep_going=args.keep_going, shares=args.share, out_dir=args.out,
            modules=[*TESTBED_MODULES, *(args.module or [])], stream=sys.stdout.buffer, log=log,
        )
    except ValidationError as e:
        print(f"testbed lab: error: {e}", file=sys.stderr)
        return 2
    except LabError as e:
        print(f"testbed lab: error: {e}", file=sys.stderr)
        if e.detail:
            print(e.detail, file=sys.stderr)
        return LAB_FAILURE_STATUS
    except KeyboardInterrupt:
        print("testbed lab: interrupted; the VM was powered off", file=sys.stderr)
        return 128 + signal.SIGINT
    except LabInterrupted as e:
        print(f"testbed lab: stopped by signal {e.signum}; the VM was powered off", file=sys.stderr)
        return 128 + e.signum
    if result.timed_out:
        print(f"testbed lab: error: command did not finish within --timeout {args.timeout:g} s "
              "(boot included); the VM was killed", file=sys.stderr)
    return result.returncode
