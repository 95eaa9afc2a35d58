"""The ``testbed`` command.  Each subcommand lives in its own module (see docs/CONTRACTS.md).

Exit status: 0 success, 1 a run or measurement failed, 2 bad input or a
missing capability (reported before anything is created), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
import warnings
from typing import Any

from traffic_control.errors import CapabilityMissing, ValidationError

PLUGINS = (
    "testbed.network.cli",
    "testbed.doctor_cli",
    "testbed.lab.cli",
    "testbed.images.cli",
    "testbed.cluster.cli",
    "testbed.planning.cli",
    "testbed.training.cli",
    "testbed.analysis.cli",
    "testbed.experiments.cli",
    "testbed.spec_schema",
)


class _Version(argparse.Action):
    """``--version``: computed when asked (git is not run on every start)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)  # type: ignore[arg-type]

    def __call__(self, parser: argparse.ArgumentParser, *a: object, **kw: object) -> None:
        from testbed.provenance import RECORD_FORMAT, git_state, version

        git = git_state()
        where = f", git {git['commit'][:12]}{' (uncommitted changes)' if git['dirty'] else ''}" if git else ""
        print(f"testbed {version()}{where}, record format {RECORD_FORMAT}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="testbed",
        description="Network-emulation testbed for geo-distributed deep-learning training: emulated data centers "
                    "(Mininet + tc), real PyTorch training with PGCS/BLP, Gsyn and baselines, collectors and figures.",
        epilog="Start with `sudo testbed doctor`, then `sudo testbed net verify three_dc_triangle`.")
    p.add_argument("--version", action=_Version, help="print the testbed's version and git commit, then exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in PLUGINS:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            if e.name and name.startswith(e.name):
                continue  # that part is not installed
            raise
        mod.register(sub)
    return p


def _show_unit_warnings() -> None:
    """Ambiguous unit spellings print as ``warning: FIELD: ...`` once each (specs are parsed more than
    once: preflight, every sweep point), other warnings as Python shows them."""
    from traffic_control.units import AmbiguousUnit

    seen: set[str] = set()
    original = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *rest: Any, **kw: Any) -> None:
        if issubclass(category, AmbiguousUnit):
            if str(message) not in seen:
                seen.add(str(message))
                print(f"warning: {message}", file=sys.stderr, flush=True)
            return
        original(message, category, *rest, **kw)

    warnings.simplefilter("always", AmbiguousUnit)
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    _show_unit_warnings()
    # Ctrl-C while the subcommands load is held until they have loaded, then ends the process (130):
    # nothing was started yet.  Raised inside an import it could surface as anything: pydantic turns it
    # into a SchemaError while it builds a model (CI: exit 1 with a traceback, 0.3 s into `net up`), and
    # an interpreter left marked as interrupted dies by SIGINT at shutdown (-2, seen at 1.1 s).
    pressed: list[int] = []
    held = threading.current_thread() is threading.main_thread()  # signal handlers: main thread only
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.append(1)) if held else None
    try:
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
        except KeyboardInterrupt:  # pressed before the handler above was in place
            pressed.append(1)
    finally:
        if held:
            signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if pressed:
        print("interrupted", file=sys.stderr)
        sys.stderr.flush()
        import os

        os._exit(130)
    try:
        return int(args.func(args) or 0)
    except ValidationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except CapabilityMissing as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except PermissionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        from testbed.cluster.remote import RemoteError
        from testbed.images.builder import ImageBuildError
        from testbed.network.docker_hosts import DockerError
        from testbed.network.emulation import NetworkBusy, NetworkError, NotUp
        from traffic_control.errors import TrafficControlError

        if isinstance(e, (NetworkBusy, DockerError, ImageBuildError)):  # fix the machine or the spec, then run again
            print(f"error: {e}", file=sys.stderr)
            return 2
        if isinstance(e, (NotUp, NetworkError, TrafficControlError, RemoteError)):  # a run failed: exit 1
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
