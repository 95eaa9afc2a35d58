"""``python -m testbed.lab ...``: the ``testbed lab`` subcommand on its own.

Why: the lab must be usable before the package is installed (bootstrap, CI
images), and this runs it from a checkout with just ``python -m``.
"""

from __future__ import annotations

import argparse
import sys

from testbed.lab.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testbed")
    register(parser.add_subparsers(dest="subcommand", required=True))
    args = parser.parse_args(["lab", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
