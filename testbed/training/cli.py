"""``testbed gsyn-plan SPEC [--json]``: predict the best Gsyn group count from measured inputs.
``testbed compute-profiles [--json]``: the accelerator profiles ``training.compute`` can emulate.

SPEC is a YAML or JSON file of planner inputs (fields documented in
``testbed.training.gsyn_plan``).  Exit 0 with the table (or JSON), 2 with
a field-named error for a bad spec.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from traffic_control.errors import ValidationError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "gsyn-plan",
        help="predict the best number of Gsyn groups from measured compute/sync/round-trip times",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("spec", help="YAML/JSON planner inputs (see testbed.training.gsyn_plan)")
    p.add_argument("--json", action="store_true", help="print the full plan as JSON")
    p.set_defaults(func=gsyn_plan_cmd)
    cp = subparsers.add_parser(
        "compute-profiles",
        help="list the per-step GPU compute profiles training.compute can emulate, with their sources",
        description="Published single-GPU training throughputs (model, GPU, batch, step time, parameter "
                    "count, source) that `training.compute: {mode: emulated, profile: NAME}` sleeps to.",
    )
    cp.add_argument("--json", action="store_true", help="print the profiles as JSON")
    cp.set_defaults(func=compute_profiles_cmd)


def compute_profiles_cmd(args: argparse.Namespace) -> int:
    from testbed.training.compute import format_profiles, profiles
    from testbed.training.schema import to_plain

    if args.json:
        print(json.dumps([dict(to_plain(p), step_s=p.step_s, grad_bytes_fp32=p.grad_bytes("fp32"),
                               grad_bytes_fp16=p.grad_bytes("fp16")) for p in profiles().values()], indent=2))
    else:
        print(format_profiles())
    return 0


def gsyn_plan_cmd(args: argparse.Namespace) -> int:
    from testbed.training.gsyn_plan import format_plan, load_spec, plan
    from topologies.loader import parse_text

    path = Path(args.spec)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        data = parse_text(text, str(path), as_json=path.suffix.lower() == ".json")
        result = plan(load_spec(data))
    except ValidationError as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_plan(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone use: ``python -m testbed.training.cli gsyn-plan SPEC``."""
    parser = argparse.ArgumentParser(prog="testbed")
    register(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
