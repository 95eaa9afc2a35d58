"""Bring one topology up across several servers (emulate mode), and down again.

The launcher places the DCs (:mod:`.placement`), works out each server's part (its DCs, and one VXLAN
tunnel end per WAN link that crosses servers, :mod:`.tunnel`), then asks every other server over SSH to
build its part (``testbed cluster part-up``, the part and the topology sent on stdin, so a topology file
need not exist there), all at once, while it builds its own.  Every part is the one-machine build restricted to its DCs:
the same names, addresses, routes and shapes.  When any part fails, the parts already up are taken down
before the error is reported.  Each remote server's clock offset from the launcher's is measured once its
part is up (:mod:`.clock`) and reported with it.  ``down`` runs ``testbed net down`` on every server (remote ones first), so it
also clears what a crashed launcher left, with no state of its own.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from topologies.model import Topology
from traffic_control.errors import ValidationError

from .clock import measure
from .model import Cluster, Server
from .placement import Placement, place
from .remote import Remote, RemoteError
from .tunnel import BASE_VNI, Part, TunnelEnd, ipv4_of, link_key

REPO = Path(__file__).resolve().parents[2]
#: Where a remote server keeps a trial's records until the launcher fetches them (``<server>/<trial>`` below;
#: testbed.cluster.trialnet); ``down`` removes the server's directory, so a crashed trial's go too.
SCRATCH = "/var/tmp/geo-testbed-trials"


def parts(topo: Topology, cluster: Cluster, placement: Placement) -> dict[str, Part]:
    """Each server's part; servers holding no DC get none."""
    addr = {s.name: ipv4_of(s.address, f"servers[{i}].address") for i, s in enumerate(cluster.servers)}
    tunnels: dict[str, dict[str, TunnelEnd]] = {s: {} for s in cluster.names}
    for i, lk in enumerate(topo.links):
        sa, sb = placement.assignment[lk.a], placement.assignment[lk.b]
        if sa == sb:
            continue
        key, vni = link_key(lk.a, lk.b), BASE_VNI + i
        tunnels[sa][key] = TunnelEnd(key, vni, addr[sa], addr[sb])
        tunnels[sb][key] = TunnelEnd(key, vni, addr[sb], addr[sa])
    return {s: Part(s, tuple(placement.dcs_on(s)), tunnels[s]) for s in cluster.names if placement.dcs_on(s)}


def remote_testbed(server: Server, args: list[str], owned: bool = False) -> str:
    """The shell command that runs ``testbed ARGS`` from the server's checkout with its Python, as root.

    ``owned``: the process carries the testbed's owner mark, so that ``testbed clean`` there ends it (a
    builder left running by a launcher that died must not add objects after the clean-up)."""
    from testbed.network import naming

    checkout = server.checkout or str(REPO)
    sudo = "" if server.user == "root" else "sudo -n "
    mark = f"env {naming.OWNER_ENV}={naming.PREFIX} " if owned else ""
    return (f"cd {shlex.quote(checkout)} && exec {sudo}{mark}{shlex.quote(server.python)} -m testbed.cli "
            + shlex.join(args))


def as_root(server: Server, argv: list[str]) -> str:
    """The shell command that runs ``argv`` as root on the server (``sudo -n`` unless it logs in as root)."""
    return ("" if server.user == "root" else "sudo -n ") + shlex.join(argv)


def _say(msg: str) -> None:
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


def up(topo: Topology, cluster: Cluster, *, impairment: str = "auto", allow_missing_netem: bool = False,
       with_ps: bool = True, seed: int | None = None, log: Callable[[str], None] = _say,
       shared_dirs: list[Path] | None = None) -> dict[str, Any]:
    """Build every server's part; returns what each reported.  On failure, every part built is removed.

    Container hosts mount ``shared_dirs`` on the launcher (a trial's directory) and, on every other server,
    its scratch directory (``SCRATCH/<server>``, where a trial's records are written there); every other
    server holding them is given the launcher's image first (:mod:`.images`)."""
    from testbed.network.emulation import EmulatedNetwork

    from .images import ensure as ensure_images

    if cluster.mode == "shape":
        return up_shape(topo, cluster, impairment=impairment, allow_missing_netem=allow_missing_netem, seed=seed,
                        log=log, shared_dirs=shared_dirs)
    placement = place(topo, cluster)
    each = parts(topo, cluster, placement)
    check_checkouts(cluster, [name for name in each if name != cluster.launcher], log)
    report: dict[str, Any] = {"placement": placement.to_dict(), "servers": {}}
    images = ensure_images(topo, cluster, placement.assignment, log)  # before the clock: up_s is the build's
    if images:
        report["images"] = images
    t0 = time.monotonic()

    def build_here() -> dict[str, Any]:
        part = each[cluster.launcher]
        log(f"{cluster.launcher} (this machine): building {', '.join(part.dcs)} ({len(part.tunnels)} tunnel(s))")
        net = EmulatedNetwork(topo, impairment=impairment, allow_missing_netem=allow_missing_netem,
                              with_ps=with_ps, seed=seed, log=log, part=part, shared_dirs=shared_dirs or ())
        net.start()
        net.stop_watching()
        return part_report(net)

    report["servers"] = build_everywhere(
        cluster, list(each),
        lambda name: _build_remote(topo, cluster, each[name], impairment, allow_missing_netem, with_ps, seed, log),
        build_here, log, "a part failed: removing the parts built so far")
    report["up_s"] = time.monotonic() - t0
    return report


def build_everywhere(cluster: Cluster, names: list[str], build_remote: Callable[[str], dict[str, Any]],
                     build_here: Callable[[], dict[str, Any]], log: Callable[[str], None],
                     failed: str) -> dict[str, Any]:
    """Build on every server in ``names`` at once: the remote ones over ssh (``build_remote(name)``), this one
    (``build_here()``, when it is among them) meanwhile; each one's report.  When any fails, every server in
    ``names`` is taken down (a failure half-way leaves objects there) before the first error is raised."""
    remote = [name for name in names if name != cluster.launcher]
    out: dict[str, Any] = {}
    try:
        errors: list[BaseException] = []
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(remote)))) as pool:
            futures = {name: pool.submit(build_remote, name) for name in remote}
            if cluster.launcher in names:
                try:
                    out[cluster.launcher] = build_here()
                except Exception as e:
                    errors.append(e)
            for name, fut in futures.items():
                try:
                    out[name] = fut.result()
                except Exception as e:
                    errors.append(e)
        if errors:
            raise errors[0]
    except BaseException:
        log(failed)
        down(cluster, only=list(names), log=log)
        raise
    return out


def up_shape(topo: Topology, cluster: Cluster, *, impairment: str = "auto", allow_missing_netem: bool = False,
             seed: int | None = None, log: Callable[[str], None] = _say,
             shared_dirs: list[Path] | None = None) -> dict[str, Any]:
    """Shape mode: every server that is a DC shapes its own egress (:mod:`.shaper`) and starts its DC's
    container hosts (mounting ``shared_dirs`` on the launcher, ``SCRATCH/<server>`` elsewhere; the launcher's
    image sent first, as in :func:`up`); same report shape as :func:`up`, with ``mode: shape`` and each
    server's shaping.  On failure, every server is cleaned."""
    from . import shaper, shaping
    from .images import ensure as ensure_images

    plans = shaping.plan(topo, cluster)
    check_checkouts(cluster, [name for name in plans if name != cluster.launcher], log)
    assignment = {p.dc: n for n, p in plans.items()}
    report: dict[str, Any] = {"mode": "shape", "placement": {"assignment": assignment},
                              "shaping": {n: p.to_dict() for n, p in plans.items()}}
    images = ensure_images(topo, cluster, assignment, log)  # before the clock: up_s is the build's
    if images:
        report["images"] = images
    t0 = time.monotonic()
    report["servers"] = build_everywhere(
        cluster, list(plans),
        lambda name: _shape_remote(topo, cluster, plans[name], impairment, allow_missing_netem, seed, log),
        lambda: shaper.up(topo, plans[cluster.launcher], impairment=impairment,
                          allow_missing_netem=allow_missing_netem, seed=seed, log=log, shared_dirs=shared_dirs or ()),
        log, "a server's shaping failed: cleaning every server")
    report["up_s"] = time.monotonic() - t0
    return report


def _shape_remote(topo: Topology, cluster: Cluster, plan: Any, impairment: str, allow_missing_netem: bool,
                  seed: int | None, log: Callable[[str], None]) -> dict[str, Any]:
    """One remote server's shaping, built by ``testbed cluster shape-up`` over ssh; its report with its clock."""
    server = cluster.server(plan.server)
    log(f"{plan.server}: shaping DC {plan.dc}'s egress to {len(plan.egress)} DC(s) over ssh")
    payload = json.dumps({"topology": topo.to_dict(), "shaping": plan.to_dict(), "impairment": impairment,
                          "allow_missing_netem": allow_missing_netem, "seed": seed, "code": code_state(),
                          "shared_dirs": [f"{SCRATCH}/{plan.server}"]})
    return _remote_build(cluster, server, ["cluster", "shape-up"], payload)


def _build_remote(topo: Topology, cluster: Cluster, part: Part, impairment: str, allow_missing_netem: bool,
                  with_ps: bool, seed: int | None, log: Callable[[str], None]) -> dict[str, Any]:
    """One remote server's part, built by ``testbed cluster part-up`` over ssh; its report."""
    name = part.server
    server = cluster.server(name)
    log(f"{name}: building {', '.join(part.dcs)} ({len(part.tunnels)} tunnel(s)) over ssh")
    payload = json.dumps({"topology": topo.to_dict(), "part": part.to_dict(), "impairment": impairment,
                          "allow_missing_netem": allow_missing_netem, "with_ps": with_ps, "seed": seed,
                          "code": code_state(), "shared_dirs": [f"{SCRATCH}/{name}"]})
    return _remote_build(cluster, server, ["cluster", "part-up"], payload)


def _remote_build(cluster: Cluster, server: Server, args: list[str], payload: str) -> dict[str, Any]:
    """Run a builder (``cluster part-up`` / ``shape-up``) on ``server`` with ``payload`` on its stdin; its JSON
    report, with the server's clock offset measured once it is up."""
    name = server.name
    with Remote(server, cluster) as r:
        cp = r.run(remote_testbed(server, args, owned=True), input=payload, timeout=600, check=False)
    if cp.returncode == 2:  # bad input found there before anything was built (e.g. a tunnel's MTU)
        raise ValidationError(f"servers[{cluster.names.index(name)}]", f"{name}: {tail_of(cp.stderr, 1)}",
                              "see the message (checked on that server)")
    if cp.returncode != 0:
        raise RemoteError(server, f"building its part failed (exit {cp.returncode}): " + tail_of(cp.stderr),
                          "see the message; `testbed net down --cluster FILE` clears every server")
    rep = json.loads(cp.stdout.strip().splitlines()[-1])
    with Remote(server, cluster) as r:  # records from this server line up with the launcher's through it
        rep["clock"] = measure(r).to_dict()
    return rep


def code_state() -> dict[str, Any]:
    """The testbed code this process runs: version, and the checkout's commit (None outside git)."""
    from ..provenance import git_state, version

    return {"version": version(), "git": git_state()}


def checkout_of(remote: Remote) -> tuple[str, bool, str | None]:
    """(path, exists, commit or None) of the testbed's checkout on the server, read over ssh."""
    checkout = remote.server.checkout or str(REPO)
    cp = remote.run(["sh", "-c", f"test -f {shlex.quote(checkout)}/testbed/__init__.py || exit 3; "
                                 f"git -C {shlex.quote(checkout)} rev-parse HEAD 2>/dev/null || echo none"],
                    timeout=60, check=False)
    commit = cp.stdout.strip()
    return checkout, cp.returncode != 3, None if cp.returncode == 3 or commit in ("none", "") else commit


def check_checkouts(cluster: Cluster, names: list[str], log: Callable[[str], None] = _say) -> None:
    """Before anything is built: every server's checkout exists and is at the launcher's commit (over ssh)."""
    ours = (code_state().get("git") or {}).get("commit")
    for name in names:
        server, i = cluster.server(name), cluster.names.index(name)
        with Remote(server, cluster) as r:
            checkout, exists, theirs = checkout_of(r)
        if not exists:
            raise ValidationError(f"servers[{i}].checkout", f"{name} has no testbed checkout at {checkout}",
                                  "clone the testbed there, or name where it is with checkout:")
        if ours and theirs is None:
            log(f"WARNING: {name}: the commit of {checkout} cannot be read (not a git checkout, or git refuses "
                "it, e.g. safe.directory); only the testbed's version is compared there")
        if ours and theirs is not None and theirs != ours:
            raise ValidationError(f"servers[{i}].checkout", f"{name}'s checkout {checkout} is at commit "
                                  f"{theirs[:12]}, the launcher's at {ours[:12]}: parts built by different code "
                                  "could differ unseen", "check out the same commit on every server")


def check_same_code(launcher: dict[str, Any] | None) -> None:
    """Refuse to build a part with other code than the launcher's: parts built by two versions of the testbed
    could shape, address or record differently, and nothing would show it."""
    from traffic_control.errors import ValidationError

    if launcher is None:
        return
    mine = code_state()
    theirs, ours = (launcher.get("git") or {}).get("commit"), (mine.get("git") or {}).get("commit")
    if (theirs and ours and theirs != ours) or (not (theirs and ours) and launcher.get("version") != mine["version"]):
        raise ValidationError("checkout", f"this server runs the testbed at {ours or mine['version']}, the launcher "
                              f"at {theirs or launcher.get('version')}",
                              "check out the same commit on every server (servers[].checkout names where)")


def part_report(net: Any) -> dict[str, Any]:
    """What a part reports: its DCs, size, backend, GPUs per host and, with any, which devices those are
    (``gpu_devices``: index, model, memory; the servers of a cluster need not be alike)."""
    from testbed.network.gpus import machine_gpus

    imp = net.impairment
    out = {"dcs": list(net.part.dcs) if net.part else [], "nodes": len(net.plan.nodes),
           "tunnels": len(net.plan.tunnels), "impairment": imp.backend if imp else None,
           "skipped": list(imp.skipped) if imp else [], "up_s": net.timings.get("up_s"),
           "gpus": {n: list(d) for n, d in net.gpu_assignment.items()}}
    if net.gpu_assignment:
        out["gpu_devices"] = machine_gpus()
    return out


def down(cluster: Cluster, *, only: list[str] | None = None,
         log: Callable[[str], None] = _say) -> dict[str, Any]:
    """``testbed net down`` on every server (or ``only`` those), remote ones first; errors are collected, not
    raised, so one unreachable server does not keep the others up."""
    from testbed.network import cleanup

    out: dict[str, Any] = {}
    for s in cluster.servers:
        if s.name == cluster.launcher or (only is not None and s.name not in only):
            continue
        try:
            with Remote(s, cluster) as r:
                cp = r.run(remote_testbed(s, ["net", "down"]), timeout=120, check=False)
                r.run(as_root(s, ["rm", "-rf", f"{SCRATCH}/{s.name}"]), timeout=120, check=False)
            out[s.name] = {"ok": cp.returncode == 0, "said": cp.stderr.strip().splitlines()[-1:]}
        except RemoteError as e:
            out[s.name] = {"ok": False, "error": str(e)}
            log(f"{s.name}: NOT cleaned: {e}")
    if only is None or cluster.launcher in only:
        removed = cleanup.cleanup()
        out[cluster.launcher] = {"ok": True, "removed": {k: len(v) for k, v in removed.items()}}
    return out


def tail_of(text: str, lines: int = 3) -> str:
    kept = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return " | ".join(kept[-lines:]) or "no message"
