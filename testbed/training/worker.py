"""Worker entry point: ``python -m testbed.training.worker JOB.json``.

Reads the job file (``jobs.Job``), sets the process up (``runtime``), runs
the scheme's worker loop from the registry and exits 0 on success, 1 on
any error (traceback on stderr, which the runner stores in logs/; the
process exits at once so peers blocked on it fail fast), 2 on a bad
command line.  Spans are flushed on every exit path.
"""

from __future__ import annotations

import os
import sys
import traceback


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m testbed.training.worker JOB.json", file=sys.stderr)
        return 2
    from testbed.training.jobs import Job
    from testbed.training.runtime import WorkerContext
    from testbed.training.schemes import SCHEMES

    job = Job.read(argv[0])
    if job.role != "worker":
        print(f"job {argv[0]} is a {job.role} job; start it with testbed.training.server", file=sys.stderr)
        return 2
    ctx = None
    try:
        ctx = WorkerContext(job)
        rc = int(SCHEMES.load(job.training.scheme.name)(ctx) or 0)
    except BaseException:
        traceback.print_exc()
        # Exit now: peers may be blocked on us in a collective and gloo's threads can
        # hold interpreter shutdown; the records are flushed first.
        if ctx is not None:
            ctx.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    ctx.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
