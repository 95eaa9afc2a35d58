"""The netem backend's jitter: each leaf's delay driven through the defined process.

netem draws jitter per packet; with order kept (netem given a rate) every
release is then a running maximum of recent draws, and bulk traffic sees a
higher mean and a smaller spread than the spec (README "Jitter, defined").
This driver realises the defined process (:mod:`traffic_control.jitter`) on
netem instead: at every interval boundary it sets the leaf's delay to that
interval's value ``d_k`` (netem's own jitter 0) with ``tc change``, keeping
netem's rate so that a packet never leaves before the one ahead of it when
the delay drops.  The userspace backend computes the same ``d_k`` (same seed,
same interval) per packet, so both backends give one distribution.

One driver process serves every driven leaf of a network (a few netlink
messages per interval boundary)::

    python -m traffic_control.jitter_driver --leaves FILE --state-dir DIR

``FILE`` (JSON, rewritten by the controller, then SIGHUP): ``{"generation":
n, "leaves": [{"netns", "ifname", "shape": LinkShape in base units, "seed"
(the delay process's), "qdisc_seed" (netem's PRNG seed, or null)}]}``.
``DIR/health.json`` (rewritten every 0.5 s, and at once after a reload: the
controller waits for its generation before it touches a released leaf): pid, generation, changes made,
how late they were after their boundary (a packet arriving in between still
gets the previous interval's delay), errors.  SIGTERM/SIGINT stop it; a
leaf whose namespace or interface is gone is dropped (its network went away)
and the driver exits when it has none left.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import write_json_atomic
from .jitter import DelayProcess, interval_s
from .qdisc import TcOp, leaf_op
from .shape import LinkShape

HEALTH_FILE = "health.json"
HEALTH_EVERY_S = 0.5


@dataclass
class Leaf:
    """One netem leaf the driver moves: where it is, its shape (with jitter), the process's seed."""

    netns: str | None
    ifname: str
    shape: LinkShape
    seed: int
    qdisc_seed: int | None = None
    process: DelayProcess = field(init=False)
    k: int | None = None

    def __post_init__(self) -> None:
        self.process = DelayProcess(self.shape.delay_s, self.shape.jitter_s, self.shape.jitter_distribution, self.seed,
                                    interval_s(self.shape.jitter_s, self.shape.jitter_interval_s))

    @property
    def key(self) -> tuple[str | None, str]:
        return (self.netns, self.ifname)

    def op_for(self, k: int) -> TcOp:
        """The ``tc change`` that gives the leaf interval ``k``'s delay, order kept.

        netem reseeds its loss generator on every change (Linux >= 6.7: the
        seed given, else a random one), so a seeded leaf gets a seed derived
        from its own and ``k``: reproducible, and no loss pattern repeated
        every interval.
        """
        seed = None
        if self.qdisc_seed is not None:
            seed = int.from_bytes(hashlib.blake2b(f"{self.qdisc_seed}:{k}".encode(), digest_size=8).digest(), "big")
        # the queue limit stays the one derived from the spec's delay + jitter (not this interval's delay)
        delay = self.process.value(k)
        if self.shape.reorder_pct:  # an interval clipped to 0 delay keeps 1 us, so reordering stays valid
            delay = max(delay, 1e-6)
        at_k = self.shape.with_changes(delay_s=delay, jitter_s=0.0, jitter_distribution="uniform",
                                       limit=self.shape.netem_limit)
        return leaf_op(at_k, "change", True, seed, keep_order=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Leaf:
        return cls(d.get("netns"), d["ifname"], LinkShape(**d["shape"]), int(d["seed"]), d.get("qdisc_seed"))


def driven(shape: LinkShape) -> bool:
    """Whether a netem leaf with ``shape`` needs the driver: jitter with order kept."""
    return shape.jitter_s > 0 and not shape.reorder


class Driver:
    """The loop's logic without clock or netlink: ``step(now)`` applies what is due, says when to wake."""

    def __init__(self, leaves: list[Leaf], apply: Callable[[Leaf, TcOp], None]) -> None:
        self.leaves = list(leaves)
        self.apply = apply
        self.stats: dict[str, Any] = {"changes": 0, "errors": 0, "late_max_s": 0.0, "late_sum_s": 0.0,
                                      "last_error": None, "dropped": []}

    def step(self, now: float) -> float | None:
        """Give every leaf whose interval changed its new delay; the next boundary (None: no leaves)."""
        for leaf in list(self.leaves):
            k = leaf.process.index(now)
            if k == leaf.k:
                continue
            try:
                self.apply(leaf, leaf.op_for(k))
            except Exception as e:  # noqa: BLE001 - a leaf whose namespace went away is dropped
                self.stats["errors"] += 1
                self.stats["last_error"] = f"{leaf.netns}:{leaf.ifname}: {e}"
                self.leaves.remove(leaf)
                self.stats["dropped"].append(f"{leaf.netns}:{leaf.ifname}")
                continue
            if leaf.k is not None:  # the first change is the start, not a boundary
                late = now - k * leaf.process.interval_s
                self.stats["late_max_s"] = max(self.stats["late_max_s"], late)
                self.stats["late_sum_s"] += late
            self.stats["changes"] += 1
            leaf.k = k
        if not self.leaves:
            return None
        return min((leaf.k + 1) * leaf.process.interval_s for leaf in self.leaves if leaf.k is not None)

    def replace(self, leaves: list[Leaf]) -> None:
        """New leaf set (the controller changed a link): kept leaves restart their process at once."""
        self.leaves = list(leaves)


def read_leaves(path: Path) -> tuple[int, list[Leaf]]:
    data = json.loads(path.read_text())
    return int(data.get("generation", 0)), [Leaf.from_dict(d) for d in data.get("leaves", [])]


def write_leaves(path: Path, generation: int, leaves: list[dict[str, Any]]) -> None:
    """The controller's side: the leaf file, atomically (then SIGHUP the driver)."""
    write_json_atomic(path, {"generation": generation, "leaves": leaves})


class _Netlink:
    """One pyroute2 handle per namespace, opened on first use."""

    def __init__(self) -> None:
        self.handles: dict[str | None, Any] = {}

    def __call__(self, leaf: Leaf, op: TcOp) -> None:
        from .netlink import run_ops

        h = self.handles.get(leaf.netns)
        if h is None:
            from pyroute2 import IPRoute, NetNS

            h = NetNS(leaf.netns) if leaf.netns else IPRoute()
            self.handles[leaf.netns] = h
        run_ops(h, leaf.ifname, [op], leaf.netns)

    def close(self) -> None:
        for h in self.handles.values():
            try:
                h.close()
            except Exception:  # noqa: BLE001
                pass


def run(leaves_path: Path, state_dir: Path) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    flags = {"reload": False, "stop": False}
    rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
    signal.signal(signal.SIGHUP, lambda *_: flags.__setitem__("reload", True))
    signal.signal(signal.SIGTERM, lambda *_: flags.__setitem__("stop", True))
    signal.signal(signal.SIGINT, lambda *_: flags.__setitem__("stop", True))
    generation, leaves = read_leaves(leaves_path)
    netlink = _Netlink()
    driver = Driver(leaves, netlink)
    health = state_dir / HEALTH_FILE

    def beat(state: str) -> None:
        s = driver.stats
        done = max(1, s["changes"] - len(driver.leaves))
        write_json_atomic(health, {"pid": os.getpid(), "state": state, "time": time.time(),
                                   "generation": generation, "leaves": len(driver.leaves),
                                   "changes": s["changes"], "errors": s["errors"], "last_error": s["last_error"],
                                   "dropped": s["dropped"], "late_max_ms": s["late_max_s"] * 1e3,
                                   "late_mean_ms": s["late_sum_s"] / done * 1e3})

    next_beat = 0.0
    try:
        while not flags["stop"]:
            if flags["reload"]:
                flags["reload"] = False
                generation, leaves = read_leaves(leaves_path)
                driver.replace(leaves)
                next_beat = 0.0  # acknowledge the new generation once its leaves are applied (sync waits)
            now = time.monotonic()
            wake = driver.step(now)
            if wake is None:
                beat("idle")
                break
            if now >= next_beat:
                beat("running")
                next_beat = now + HEALTH_EVERY_S
            wait = min(wake, next_beat) - time.monotonic()
            if wait > 0:
                select.select([rfd], [], [], wait)
                try:
                    os.read(rfd, 512)
                except BlockingIOError:
                    pass
    finally:
        netlink.close()
    beat("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traffic_control.jitter_driver", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leaves", required=True, type=Path, help="the leaf file (JSON, see above)")
    ap.add_argument("--state-dir", required=True, type=Path, help=f"where {HEALTH_FILE} is written")
    args = ap.parse_args(argv)
    return run(args.leaves, args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
