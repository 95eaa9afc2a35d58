#!/usr/bin/env python3
"""Draw a campaign's ``schemes`` figure from its committed summaries (``results/reference/<name>/trials.csv``).

A campaign that ran in parts over several days may no longer have every point's raw records on one
machine (only summaries are committed), so ``testbed report`` cannot draw all its schemes in one
figure; the per-trial table it wrote can.  The figure is the report's own (``figures.schemes``: bars
are means over the trials that reached the target, whiskers 95 % intervals, dots the trials), with the
unfaithful trials named under it, as the report names them.

    .venv/bin/python benchmarks/claims/reference_figure.py results/reference/claims_gsyn \\
        docs/figures/claims_gsyn_schemes --note "emulated A100 ..."
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from testbed.analysis.figures import schemes
from testbed.analysis.report import unfaithful_text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reference", type=Path, help="a results/reference/<name> folder holding trials.csv")
    ap.add_argument("out", type=Path, help="the figure's path without suffix (writes .pdf and .png)")
    ap.add_argument("--note", help="the compute model, as the report's summary.md names it")
    args = ap.parse_args(argv)
    table = args.reference / "trials.csv"
    if not table.is_file():
        print(f"error: {table}: no such file (the reference folder's per-trial table)", file=sys.stderr)
        return 2
    trials = pd.read_csv(table)
    missing = {"scheme", "trial", "time_to_target_s", "compute_utilization"} - set(trials.columns)
    if missing:
        print(f"error: {table}: no column {', '.join(sorted(missing))} (not a report's trials table)",
              file=sys.stderr)
        return 2
    paths = schemes(trials, args.out.parent, args.out.name, note=args.note,
                    warning=unfaithful_text(trials, where=str(table)))
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
