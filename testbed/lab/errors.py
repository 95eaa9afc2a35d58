"""Errors of the kernel lab.

Every way the lab itself can fail (as opposed to the command run inside it)
raises a :class:`LabError` whose message says what broke and how to fix it, so
the CLI can print one line and exit with :data:`LAB_FAILURE_STATUS` instead of
a traceback.  Bad user input (a timeout <= 0, a relative share path) is a
``traffic_control.errors.ValidationError`` like everywhere else in the project.
"""

from __future__ import annotations

#: Exit status when the lab could not run the command (qemu missing, kernel
#: package not downloadable, guest panic).  Chosen like ``docker run``: 125 is
#: outside the range a shell gives a command (126/127/128+N).
LAB_FAILURE_STATUS = 125

#: Exit status when the command overran the time limit (as coreutils ``timeout``).
TIMEOUT_STATUS = 124


class LabError(RuntimeError):
    """The lab could not run the command; ``fix`` says what to do about it."""

    def __init__(self, problem: str, fix: str = "", detail: str = "") -> None:
        self.problem = problem
        self.fix = fix
        self.detail = detail
        msg = problem
        if fix:
            msg += f" (fix: {fix})"
        super().__init__(msg)


class KernelUnavailable(LabError):
    """No kernel package could be resolved, downloaded or extracted."""


class QemuMissing(LabError):
    """qemu-system-x86_64 (or another host tool the lab needs) is not installed."""


class GuestPanic(LabError):
    """The guest kernel panicked or the VM stopped before the command finished."""


class GuestSetupFailed(LabError):
    """The guest booted but could not prepare the command (mounts, modules)."""


class LabInterrupted(BaseException):
    """SIGTERM/SIGHUP arrived while the VM ran; it was powered off.

    A BaseException like KeyboardInterrupt, so ``except Exception`` in callers
    does not swallow a request to stop.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
