"""Where a record came from: testbed version, git commit, record format, software, kernel, capabilities.

Every run and trial manifest carries :func:`provenance` so a figure can be traced
to the code and machine that made it, and ``testbed rerun`` can say what changed
since (:func:`differences`).  Standard library only (safe to import anywhere).
"""

from __future__ import annotations

import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

#: version of the layout of results/ (manifest keys, CSV columns; docs/CONTRACTS.md).
#: Raised when a reader of an older run would misread a newer one.
RECORD_FORMAT = 2

DIST_NAME = "geo-testbed"
REPO_ROOT = Path(__file__).resolve().parents[1]
SOFTWARE = ("torch", "pyroute2", "numpy", "scipy", "networkx", "matplotlib", "pandas")


def version() -> str:
    """The installed testbed's version (the source tree's, when run from a checkout)."""
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def git_state(root: Path = REPO_ROOT) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the checkout the code runs from; None outside a git checkout.

    ``dirty`` counts tracked files that differ from the commit (untracked files do not
    change what runs unless imported, and results/ lives in the tree).
    """
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit, "dirty": bool(changed), "changed_files": changed[:50]}


def software() -> dict[str, str]:
    """Versions of Python, the libraries a result depends on, and Mininet."""
    out = {"python": platform.python_version()}
    for mod in SOFTWARE:
        try:
            out[mod] = str(metadata.version(mod))
        except metadata.PackageNotFoundError:
            out[mod] = "missing"
    try:
        import mininet.net

        out["mininet"] = str(getattr(mininet.net, "VERSION", "?"))
    except Exception:
        out["mininet"] = "missing"
    return out


def capabilities() -> dict[str, Any]:
    """What this kernel can do (``doctor``'s probe): ``{name: {"ok", "detail"}}``; needs root."""
    try:
        from traffic_control.capabilities import probe_kernel

        return {k: {"ok": c.ok, "detail": c.detail} for k, c in probe_kernel().items()}
    except Exception as e:  # never lose a manifest over a probe
        return {"error": f"{type(e).__name__}: {e}"}


def provenance(*, with_capabilities: bool = False) -> dict[str, Any]:
    """The block written as ``manifest["provenance"]`` (run level adds capabilities)."""
    out: dict[str, Any] = {
        "record_format": RECORD_FORMAT,
        "testbed_version": version(),
        "git": git_state(),
        "software": software(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "host": platform.node(),
    }
    if with_capabilities:
        out["capabilities"] = capabilities()
    return out


def differences(then: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Human-readable lines for what differs between two provenance blocks (``rerun``)."""
    lines: list[str] = []

    def cmp(label: str, a: Any, b: Any) -> None:
        if a != b:
            lines.append(f"{label}: {a if a is not None else '-'} then, {b if b is not None else '-'} now")

    cmp("record format", then.get("record_format"), now.get("record_format"))
    cmp("testbed version", then.get("testbed_version"), now.get("testbed_version"))
    g0, g1 = then.get("git") or {}, now.get("git") or {}
    cmp("git commit", g0.get("commit"), g1.get("commit"))
    if g0.get("dirty") or g1.get("dirty"):
        lines.append(f"uncommitted changes: {'yes' if g0.get('dirty') else 'no'} then, "
                     f"{'yes' if g1.get('dirty') else 'no'} now (the commit alone does not pin the code)")
    s0, s1 = then.get("software") or {}, now.get("software") or {}
    for k in sorted(set(s0) | set(s1)):
        cmp(k, s0.get(k), s1.get(k))
    cmp("kernel", then.get("kernel"), now.get("kernel"))
    c0, c1 = then.get("capabilities") or {}, now.get("capabilities") or {}
    for k in sorted(set(c0) | set(c1)):
        a, b = (c0.get(k) or {}).get("ok"), (c1.get(k) or {}).get("ok")
        if a != b:
            lines.append(f"capability {k}: {'yes' if a else 'no'} then, {'yes' if b else 'no'} now")
    return lines
