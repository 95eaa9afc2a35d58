"""Errors shared by every layer that validates user input.

One error type carries the *path* of the offending field (``links[2].forward.rate``),
what is wrong, and how to fix it.  The CLI turns it into a one-line message and
exit status 2 before anything is created.  It lives here, in the lowest layer,
because ``topologies`` and ``testbed`` both build on ``traffic_control`` and
must not be imported by it.
"""

from __future__ import annotations


class ValidationError(ValueError):
    """Bad input: names the field path, the problem, and the fix."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"{field}: {problem}" if field else problem
        if fix:
            msg += f" (fix: {fix})"
        super().__init__(msg)

    def under(self, prefix: str) -> ValidationError:
        """The same error with ``prefix`` prepended to its field path."""
        field = f"{prefix}.{self.field}" if self.field and not self.field.startswith("[") else f"{prefix}{self.field}"
        return ValidationError(field, self.problem, self.fix)


class TrafficControlError(RuntimeError):
    """The kernel refused a traffic-control operation (carries the netlink reason)."""


class CapabilityMissing(TrafficControlError):
    """A needed kernel feature or tool (sch_netem, iptables) is absent; ``fix`` says how to get it."""

    def __init__(self, feature: str, fix: str) -> None:
        self.feature = feature
        self.fix = fix
        super().__init__(f"this machine lacks {feature} (fix: {fix})")
