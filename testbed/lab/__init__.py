"""Kernel lab: run commands on a stock distribution kernel under QEMU (TCG).

Why it exists: the development and CI kernels have no ``sch_netem``, so
everything about latency, jitter and loss would go untested.  The lab boots
the distribution's own kernel package (downloaded into a cache, never
installed) with the host root shared read-only over 9p, loads the modules the
testbed needs and runs one command there.  See ``testbed lab --help``.
"""

from testbed.lab.errors import LAB_FAILURE_STATUS, TIMEOUT_STATUS, LabError
from testbed.lab.vm import LabResult, lab_available, run_in_lab

__all__ = ["LAB_FAILURE_STATUS", "TIMEOUT_STATUS", "LabError", "LabResult", "lab_available", "run_in_lab"]
