"""BLP: LP-planned aggregation trees for cross-DC all-reduce, their executor, and baselines.

Our reading of BLP (the paper is closed-access; see docs/DESIGN.md "Training
model"): given the DC graph with per-direction capacities and latencies and
the gradient size, choose aggregation trees over the graph (relaying through
DCs allowed, only existing links) and the share of the gradient each carries
so that the slowest link finishes first, as a (mixed-integer) linear program
solved with HiGHS.  The executor runs exactly that plan between DC leaders.

* :mod:`.model`     -- :class:`Plan`/:class:`Tree`, JSON, :func:`validate_plan`, the cost model
* :mod:`.solver`    -- :func:`plan_blp` (LP or MIP)
* :mod:`.baselines` -- the strong baselines (relayed leader ring, best single tree,
  Blink-style packing, hierarchical, PS star) and the flat-ring references, same cost model
* :mod:`.executor`  -- :class:`~.executor.BlpAllReduce` (plans: BLP, tree_best, blink, star),
  ``RingRelayAllReduce``, ``HierarchicalAllReduce`` (torch.distributed, imported on demand)
* :mod:`.bench`     -- timing BLP and every executable baseline on initialised groups
* :mod:`.cli`       -- ``testbed blp-plan``

This package imports torch only in :mod:`.executor` and :mod:`.bench`, so
planning works where torch is absent; and scipy only when :func:`plan_blp`
(or the ``blink`` baseline, which plans with it) is first used, so that every ``testbed`` command does
not pay scipy's import (a third of a second here, many seconds in the
kernel lab's emulated CPU).
"""

from typing import Any

from .baselines import (
    SchemeCost,
    baselines,
    best_ring_cost,
    blink_cost,
    hierarchical_cost,
    ring_cost,
    ring_relay_cost,
    star_cost,
    tree_best_cost,
)
from .model import (
    LinkLoad,
    Plan,
    PlanCost,
    Tree,
    auto_chunks,
    evaluate,
    route_mismatches,
    validate_plan,
)

__all__ = [
    "LinkLoad", "Plan", "PlanCost", "SchemeCost", "Tree", "auto_chunks", "baselines", "best_ring_cost",
    "blink_cost", "evaluate", "hierarchical_cost", "plan_blp", "ring_cost", "ring_relay_cost", "route_mismatches",
    "star_cost", "tree_best_cost", "validate_plan",
]


def __getattr__(name: str) -> Any:
    if name == "plan_blp":
        from . import solver

        return getattr(solver, name)
    raise AttributeError(name)
