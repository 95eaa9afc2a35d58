"""``testbed doctor [--json]``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .doctor import format_doctor, run_doctor


def cmd_doctor(args: argparse.Namespace) -> int:
    report = run_doctor()
    print(json.dumps(report, indent=2) if args.json else format_doctor(report))
    return 0 if report["ok"] else 1


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check root, kernel features (netem, HTB, ...), tools, Python deps, CUDA; "
                                      "print the fix for each gap")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)
