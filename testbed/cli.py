"""The ``testbed`` command.  Each subcommand lives in its own module (see docs/CONTRACTS.md).

Exit status: 0 success, 1 a run or measurement failed, 2 bad input or a
missing capability (reported before anything is created), 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from traffic_control.errors import CapabilityMissing, ValidationError

PLUGINS = (
    "testbed.network.cli",
    "testbed.doctor_cli",
    "testbed.lab.cli",
    "testbed.planning.cli",
    "testbed.training.cli",
    "testbed.analysis.cli",
    "testbed.experiments.cli",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="testbed",
        description="Network-emulation testbed for geo-distributed deep-learning training: emulated data centers "
                    "(Mininet + tc), real PyTorch training with PGCS/BLP, Gsyn and baselines, collectors and figures.",
        epilog="Start with `sudo testbed doctor`, then `sudo testbed net verify three_dc_triangle`.")
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


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # Ctrl-C while the subcommands load: nothing was started yet
        print("interrupted", file=sys.stderr)
        return 130
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
        from testbed.network.emulation import NetworkBusy, NetworkError, NotUp
        from traffic_control.errors import TrafficControlError

        if isinstance(e, NetworkBusy):
            print(f"error: {e}", file=sys.stderr)
            return 2
        if isinstance(e, (NotUp, NetworkError, TrafficControlError)):
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
