"""The netfilter rules that steer an interface's egress into a queue, and their cleanup.

Rule: ``mangle POSTROUTING -o IFNAME -j NFQUEUE --queue-num N`` for IPv4 and
IPv6, tagged with a comment marker so cleanup finds every rule this backend
installed, and nothing else, even after the daemon was SIGKILLed.

Decisions, and why:

* POSTROUTING runs before the egress qdisc, so a packet is delayed first and
  rate-limited by HTB after (the same order as a netem child under an HTB
  class, which only hands HTB packets whose time has come).
* No ``--queue-bypass``: if no process is bound to the queue the kernel drops
  the packet.  The link *fails closed*: an experiment can never silently run
  without its latency; it stalls visibly instead, and the controller marks it.
* Appended (``-A``), not inserted: a queued packet skips the rest of its
  chain when reinjected, so rules others put in mangle POSTROUTING run first.

iptables (nf_tables or legacy backend, whichever the host has) is used through
argument lists, never a shell.  Commands run in the caller's network
namespace; ``prefix`` (e.g. ``nsenter --net=...``) runs them in another one.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence

MARKER = "tc-userspace"
TOOLS = (("iptables", "iptables-save"), ("ip6tables", "ip6tables-save"))


class RuleError(RuntimeError):
    """iptables refused a rule (message carries its stderr)."""


def marker(ifname: str, queue: int | str) -> str:
    """The comment that tags this backend's rule for one interface."""
    return f"{MARKER}:{ifname}:q{queue}"


def _run(argv: Sequence[str], prefix: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=20, check=False)


def _available(tool: str) -> bool:
    return shutil.which(tool) is not None


def install(ifname: str, queue: int, prefix: Sequence[str] = ()) -> None:
    """Steer ``ifname``'s egress (IPv4 and, where present, IPv6) into NFQUEUE ``queue``.

    Fails closed by construction (no ``--queue-bypass``).  IPv4 is required;
    IPv6 is best effort, since some kernels and containers lack it.
    """
    for index, (tool, argv) in enumerate(zip((t for t, _ in TOOLS), rule_argvs(ifname, queue))):
        if not _available(tool):
            if index == 0:
                raise RuleError(f"{tool} not found: install the iptables package")
            continue
        result = _run(argv, prefix)
        if result.returncode != 0 and index == 0:
            raise RuleError(f"{' '.join(argv)}: {result.stderr.strip()}")


def rule_argvs(ifname: str, queue: int | str) -> list[list[str]]:
    """The iptables and ip6tables commands :func:`install` runs (also what a dry run prints)."""
    return [[tool, "-w", "-t", "mangle", "-A", "POSTROUTING", "-o", ifname, "-m", "comment", "--comment",
             marker(ifname, queue), "-j", "NFQUEUE", "--queue-num", str(queue)] for tool, _save in TOOLS]


def list_rules(prefix: Sequence[str] = (), ifname: str | None = None) -> list[tuple[str, list[str]]]:
    """``(tool, rule arguments)`` of every marked rule, optionally only for ``ifname``."""
    found: list[tuple[str, list[str]]] = []
    want = f"{MARKER}:{ifname}:" if ifname else f"{MARKER}:"
    for tool, save in TOOLS:
        if not _available(save):
            continue
        result = _run([save, "-t", "mangle"], prefix)
        if result.returncode != 0:
            continue
        for line in result.stdout.splitlines():
            if not line.startswith("-A ") or want not in line:
                continue
            args = shlex.split(line)
            comment = args[args.index("--comment") + 1] if "--comment" in args else ""
            if comment.startswith(want):
                found.append((tool, args[1:]))
    return found


def remove(prefix: Sequence[str] = (), ifname: str | None = None) -> int:
    """Delete every marked rule (all interfaces, or one); returns how many went.

    Idempotent and independent of any process state: it reads the rules back
    from the kernel, so it works after a crash of the daemon or its parent.
    """
    removed = 0
    for tool, args in list_rules(prefix, ifname):
        result = _run([tool, "-w", "-t", "mangle", "-D", *args], prefix)
        if result.returncode == 0:
            removed += 1
    return removed
