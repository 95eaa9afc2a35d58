"""Parameters of each synchronization scheme (torch-free).

Our reading of Gsyn (the paper is closed-access; only its abstract is
public, see docs/DESIGN.md "Training model"): workers are split into G groups;
inside a group training is bulk-synchronous (the members' gradients are
averaged over the LAN); each group's leader pushes the group-averaged
gradient to a parameter server *asynchronously*, tagged with the model
version it was computed on; the server applies it at once and returns its
current model, which the leader broadcasts to its group.  An update's
staleness is the server's version when applying it minus the version it was
computed on.  G=1 is BSP through the server, G=N is ASP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from testbed.training.schema import ValidationError


@dataclass
class BspParams:
    """Bulk-synchronous data parallel: every step all workers average gradients.

    ``ring``: one ring all-reduce (reduce-scatter + all-gather) over all
    workers, ring ordered by DC so it crosses each DC boundary once per
    direction.  ``hierarchical``: reduce to a leader inside each DC, ring
    all-reduce among DC leaders, broadcast inside each DC.
    """

    uses_server: ClassVar[bool] = False
    allreduce: Literal["ring", "hierarchical"] = "ring"

    def update_workers(self, world_size: int, groups: list[list[int]] | None = None) -> int:
        """Every update averages all N workers' gradients (``testbed.training.lr``)."""
        return world_size


@dataclass
class AspParams:
    """Asynchronous parameter server: each worker pushes and pulls on its own clock."""

    uses_server: ClassVar[bool] = True

    def update_workers(self, world_size: int, groups: list[list[int]] | None = None) -> int:
        """Each push, one worker's gradient, is one update (``testbed.training.lr``)."""
        return 1


@dataclass
class SspParams:
    """Stale-synchronous parameter server with Petuum clock semantics.

    A worker's clock is the number of gradients it has pushed.  A worker may
    start the step at clock ``c`` only while ``c - min(clocks) <= staleness``
    (it leads the slowest worker by at most ``staleness`` clocks); the
    server holds the reply to a push until that holds.  ``staleness: 0``
    makes every worker wait for all others each clock (BSP's barrier); each
    push is still applied on arrival as its own update.
    """

    uses_server: ClassVar[bool] = True
    staleness: int = 2  # clocks

    def update_workers(self, world_size: int, groups: list[list[int]] | None = None) -> int:
        """As ASP: one worker's gradient per update (``testbed.training.lr``)."""
        return 1

    def check(self, field: str) -> None:
        if self.staleness < 0:
            raise ValidationError(f"{field}.staleness", f"must be >= 0, got {self.staleness}",
                                  "use 0 (lock-step) or a positive bound")


@dataclass
class GsynParams:
    """Gsyn as we read it (module doc).  ``groups``:

    * ``null`` (default): one group per data center;
    * an integer G: workers ordered by (DC, rank) cut into G contiguous
      groups of near-equal size (groups stay inside DCs when G is a
      multiple of the DC count and sizes allow);
    * a list of host-name lists: explicit membership, every worker host in
      exactly one group; a group's leader is its first-listed host.
    """

    uses_server: ClassVar[bool] = True
    groups: int | list[list[str]] | None = None

    def update_workers(self, world_size: int, groups: list[list[int]] | None = None) -> int | list[int]:
        """A push is one group's averaged gradient: the group's size, per group (``testbed.training.lr``).

        Without resolved groups (no worker list yet) one worker is assumed."""
        return [len(g) for g in groups] if groups else 1

    def check(self, field: str) -> None:
        if isinstance(self.groups, int) and self.groups < 1:
            raise ValidationError(f"{field}.groups", f"must be >= 1, got {self.groups}", "use 1..number of workers")
        if isinstance(self.groups, list):
            if not self.groups:
                raise ValidationError(f"{field}.groups", "empty group list", "list at least one group")
            seen: dict[str, int] = {}
            for i, grp in enumerate(self.groups):
                if not grp:
                    raise ValidationError(f"{field}.groups[{i}]", "empty group", "give at least one host")
                for h in grp:
                    if h in seen:
                        raise ValidationError(f"{field}.groups[{i}]", f"host {h!r} is already in group {seen[h]}",
                                              "put every host in exactly one group")
                    seen[h] = i

    def resolve(self, workers: Sequence[tuple[str, str]], field: str = "groups") -> list[list[int]]:
        """Groups as lists of worker indices (into ``workers`` = [(host, dc)] in rank order).

        Leader = first index of each group.  Raises ValidationError when the
        groups do not fit the workers.
        """
        n = len(workers)
        if self.groups is None:
            order: dict[str, list[int]] = {}
            for i, (_, dc) in enumerate(workers):
                order.setdefault(dc, []).append(i)
            return list(order.values())
        if isinstance(self.groups, int):
            g = self.groups
            if g > n:
                raise ValidationError(field, f"G={g} is larger than the {n} workers",
                                      f"use at most {n} groups")
            dcs: list[str] = []
            for _, dc in workers:
                if dc not in dcs:
                    dcs.append(dc)
            ranked = sorted(range(n), key=lambda i: (dcs.index(workers[i][1]), i))
            base, extra = divmod(n, g)
            out, start = [], 0
            for j in range(g):
                size = base + (1 if j < extra else 0)
                out.append(ranked[start:start + size])
                start += size
            return out
        index = {h: i for i, (h, _) in enumerate(workers)}
        out = []
        for j, grp in enumerate(self.groups):
            ids = []
            for h in grp:
                if h not in index:
                    raise ValidationError(f"{field}[{j}]", f"host {h!r} is not a worker host",
                                          f"use hosts from: {', '.join(sorted(index))}")
                ids.append(index[h])
            out.append(ids)
        missing = sorted(set(range(n)) - {i for grp in out for i in grp})
        if missing:
            raise ValidationError(field, f"worker host {workers[missing[0]][0]!r} is in no group",
                                  "list every worker host in one group")
        return out


@dataclass
class DilocoParams:
    """DiLoCo (Douillard et al., 2023, arXiv:2311.08105): local SGD with an outer optimizer.

    Every worker runs ``inner_steps`` (H) steps of the training's optimizer (the *inner*
    optimizer, its state kept per worker across rounds) on its own shard, from the global
    model; then the workers average their *outer gradients* (global minus local parameters,
    one ring all-reduce of the model's size per H steps instead of one per step) and every
    worker applies the same outer step, SGD with Nesterov momentum (the paper's
    ``outer_lr`` 0.7, momentum 0.9), to the global model.  ``inner_steps: 1`` with
    ``outer_lr: 1, outer_momentum: 0`` is parameter averaging after every step.
    """

    uses_server: ClassVar[bool] = False
    inner_steps: int = 50
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True

    def update_workers(self, world_size: int, groups: list[list[int]] | None = None) -> int:
        """Inner steps use one worker's batch; the outer step keeps its own ``outer_lr`` (``testbed.training.lr``)."""
        return 1

    def check(self, field: str) -> None:
        if self.inner_steps < 1:
            raise ValidationError(f"{field}.inner_steps", f"must be >= 1, got {self.inner_steps}",
                                  "e.g. inner_steps: 50 (H, steps between outer syncs)")
        if self.outer_lr <= 0:
            raise ValidationError(f"{field}.outer_lr", f"must be > 0, got {self.outer_lr}", "e.g. outer_lr: 0.7")
        if not 0 <= self.outer_momentum < 1:
            raise ValidationError(f"{field}.outer_momentum", "must be in [0, 1)", "e.g. outer_momentum: 0.9")
