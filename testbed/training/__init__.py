"""Training that runs inside trainer hosts: workloads, schemes, parameter server, planner.

Never imports Mininet or network-building code: a process knows its peers
by address (the job file), so the same code runs on real machines.

Entry points: ``python -m testbed.training.worker JOB.json`` and
``python -m testbed.training.server JOB.json``.  The runner builds jobs
with :func:`make_jobs` from the validated ``training`` section
(:func:`validate_training`) and a placement, and supervises the processes
with :class:`testbed.training.supervise.Supervisor`.
"""

from testbed.training.config import TrainingConfig, validate_training
from testbed.training.jobs import Job, Placement, make_jobs, write_jobs

__all__ = ["Job", "Placement", "TrainingConfig", "make_jobs", "validate_training", "write_jobs"]
