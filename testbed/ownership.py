"""Files written under ``sudo`` belong to the user who typed it, not to root.

The testbed must run as root (namespaces, tc), so ``sudo testbed run ...``
would leave ``results/`` owned by root and the researcher unable to move or
delete their own figures.  After a command writes results, :func:`hand_over`
gives what it created to ``SUDO_UID``/``SUDO_GID`` (set by sudo).  Only
entries still owned by root inside the trees we wrote are changed; nothing
outside them is touched, and without sudo (CI as root, a root shell) nothing
happens at all.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def invoking_user() -> tuple[int, int] | None:
    """``(uid, gid)`` of the user behind sudo, or None (not root, no sudo, or sudo from root)."""
    if os.geteuid() != 0:
        return None
    try:
        uid, gid = int(os.environ["SUDO_UID"]), int(os.environ["SUDO_GID"])
    except (KeyError, ValueError):
        return None
    return None if uid == 0 else (uid, gid)


def missing_parents(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet (call before creating them, so that
    :func:`hand_over` can give exactly the directories this command made)."""
    out: list[Path] = []
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def hand_over(roots: Iterable[Path], owner: tuple[int, int] | None = None) -> int:
    """Give every root-owned entry at and under ``roots`` to the invoking user; returns how many.

    Symlinks are changed themselves, never followed.  Errors (a file vanished, a read-only
    mount) are ignored: ownership is a convenience, never a reason to fail a run.
    """
    owner = owner or invoking_user()
    if owner is None:
        return 0
    uid, gid = owner
    changed = 0

    def give(p: str) -> None:
        nonlocal changed
        try:
            st = os.lstat(p)
            if st.st_uid == 0:
                os.chown(p, uid, gid, follow_symlinks=False)
                changed += 1
        except OSError:
            pass

    for root in roots:
        root = Path(root)
        if not os.path.lexists(root):
            continue
        give(str(root))
        if root.is_dir() and not root.is_symlink():
            for dirpath, dirnames, filenames in os.walk(root):
                for name in dirnames + filenames:
                    give(os.path.join(dirpath, name))
    return changed
