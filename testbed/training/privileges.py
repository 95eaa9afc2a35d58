"""A trainer in a container host gives up every Linux capability before it runs anything else.

Why here, in the trainer: the testbed enters a container host's namespaces
from the host (``nsenter``, which itself needs ``CAP_SYS_ADMIN``), so the
process it starts is root with the host's full capability set, although the
container was started with ``--cap-drop ALL``.  Nothing a trainer does needs
a capability (unprivileged ports, files in the trial directory, which root
owns), so it drops them all as its first act, with the image's own Python and
no tool from the image: the bounding set (so no later ``exec`` regains any),
the ambient set, then the effective, permitted and inheritable sets
(``capset``), and sets ``no_new_privs``.  The process record says it did
(``runtime.process_record``: ``capabilities``).  Standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

#: Set by the testbed in a container trainer's environment (``docker_hosts.trainer_env``).
ENV = "TESTBED_DROP_CAPS"


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def drop_all() -> None:
    """Give up every capability of this process and of everything it will exec (raises OSError on failure)."""
    libc = _libc()
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0), f"drop capability {cap} from the bounding set")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear the ambient set")
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()  # all zero: no effective, permitted or inheritable capability
    _check(libc.capset(ctypes.byref(header), data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def current() -> dict[str, str]:
    """This process's capability sets as ``/proc/self/status`` gives them (hex masks)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")):
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def apply_from_env() -> dict[str, str] | None:
    """Drop everything when the testbed asked for it (a container trainer); returns the sets after, else None."""
    if os.environ.get(ENV) != "1":
        return None
    drop_all()
    return current()
