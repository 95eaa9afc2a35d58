"""``python -m traffic_control.userspace run|cleanup ...``.

``run`` is the daemon (see :mod:`.daemon`); ``cleanup`` removes every rule this
backend installed in the current (or ``--netns``) network namespace, for a
teardown after crashes.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "run":
        from .daemon import main as run_main

        return run_main(args[1:])
    p = argparse.ArgumentParser(prog="python -m traffic_control.userspace")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="the per-interface daemon (see 'run --help')")
    c = sub.add_parser("cleanup", help="remove this backend's netfilter rules")
    c.add_argument("--netns", default=None, help="namespace name, /path, or pid (default: current)")
    c.add_argument("--ifname", default=None, help="only this interface's rules")
    opts = p.parse_args(args)
    from .control import cleanup

    netns = int(opts.netns) if opts.netns and opts.netns.isdigit() else opts.netns
    print(f"removed {cleanup(netns, opts.ifname)} rule(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
