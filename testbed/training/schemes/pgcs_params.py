"""Parameters of ``pgcs`` and its ``ddp_overlap`` baseline (torch-free).

Our reading of PGCS (the paper is closed-access; only its abstract is
public, see docs/DESIGN.md "Training model"): the model is E >= 2 experts
(separate parameter sets).  At step ``t`` every worker computes the
gradient of expert ``t mod E`` while a communication thread synchronizes
(averages across all workers and DCs) the gradients of the experts computed
before; an expert's synchronization and update finish before that expert's
next compute, so no update is ever stale and the result equals
compute-then-sync exactly.  The gain over compute-then-sync approaches
``(compute + sync) / max(compute, sync)``.

``pgcs`` with ``overlap: false`` is the sequential baseline (the same
experts and steps, compute then sync on the main thread); ``ddp_overlap`` is
the DDP-style baseline (one expert per step as well, its gradient cut into
``buckets`` that are synchronized as soon as backward has produced them, so
sync overlaps only the rest of that expert's backward).

``sync``: ``allreduce`` = ring all-reduce over all workers ordered by DC;
``hierarchical`` = reduce to each DC's leader, ring among leaders,
broadcast in each DC; ``blp`` = the BLP executor following a plan
(``testbed.planning``), given inline as ``plan`` (the object that
``Plan.to_json`` writes) or as ``plan_file`` (a path to that JSON).  The
runner may fill ``plan`` in after planning for the topology; a ``blp`` run
without either fails at start with an error naming ``training.scheme.plan``.

``experts``: the number of experts.  With the ``experts`` workload it must
be null or equal the workload's ``experts``; with any single-model workload
(``synthetic``, ``charlm``, ``digits``) the scheme builds that many
independent copies of the workload's model, expert ``k`` seeded
``seed + 1000 k`` (default 2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from testbed.training.schema import ValidationError

__all__ = ["DdpOverlapParams", "PgcsParams", "DEFAULT_EXPERTS"]

#: Experts built from a single-model workload when ``experts`` is not given.
DEFAULT_EXPERTS = 2


@dataclass
class PgcsParams:
    """Pipelined multi-expert compute/sync (module doc); ``overlap: false`` = sequential baseline."""

    uses_server: ClassVar[bool] = False
    overlap_kind: ClassVar[str] = "experts"

    sync: Literal["allreduce", "hierarchical", "blp"] = "allreduce"
    overlap: bool = True
    experts: int | None = None
    plan: dict[str, Any] | None = None  # a BLP plan object (Plan.to_json) for sync: blp
    plan_file: str | None = None  # or a path to that JSON

    def update_workers(self, world_size: int, groups: Any = None) -> int:
        """Every expert's update averages all N workers' gradients (``testbed.training.lr``)."""
        return world_size

    def check(self, field: str) -> None:
        f = f"{field}." if field else ""
        if self.experts is not None and self.experts < 2:
            raise ValidationError(f"{f}experts", f"must be >= 2, got {self.experts}",
                                  "PGCS overlaps one expert's sync with another's compute: use 2 or more")
        if self.plan is not None and self.plan_file is not None:
            raise ValidationError(f"{f}plan_file", "give plan or plan_file, not both", "drop one")
        if (self.plan is not None or self.plan_file is not None) and self.sync != "blp":
            which = "plan" if self.plan is not None else "plan_file"
            raise ValidationError(f"{f}{which}", f"a BLP plan is only used with sync: blp (sync is {self.sync})",
                                  "set sync: blp or drop the plan")
        self.load_plan(field)

    def load_plan(self, field: str = "training.scheme") -> Any:
        """The BLP plan (``testbed.planning.model.Plan``) or None; errors name the field."""
        f = f"{field}." if field else ""
        if self.plan is not None:
            from testbed.planning.model import Plan

            return Plan.from_dict(self.plan, f"{f}plan")
        if self.plan_file is not None:
            from testbed.planning.model import Plan

            path = Path(self.plan_file)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as e:
                raise ValidationError(f"{f}plan_file", f"cannot read {path}: {e.strerror or e}",
                                      "give the path of a plan written by `testbed blp-plan --json`") from None
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValidationError(f"{f}plan_file", f"{path} is not valid JSON: {e}",
                                      "give a plan written by `testbed blp-plan --json`") from None
            return Plan.from_dict(data, f"{f}plan_file")
        return None

    def expert_count(self, workload_name: str, workload_params: Any) -> int:
        """E for this run: the workload's own count, or ``experts`` copies of a single-model workload."""
        own = getattr(workload_params, "experts", None) if workload_name == "experts" else None
        if own is not None:
            return int(own)
        return self.experts if self.experts is not None else DEFAULT_EXPERTS

    def check_training(self, tc: Any, workers: Sequence[tuple[str, str]] | None, field: str) -> None:
        """Checks against the rest of the training section (and the worker hosts when known)."""
        f = f"{field}." if field else ""
        if tc.workload.name == "experts" and self.experts is not None:
            own = tc.workload.params.experts
            if own != self.experts:
                raise ValidationError(f"{f}experts", f"{self.experts} experts, but the experts workload has {own}",
                                      f"drop {f}experts or set it to {own}")
        if self.sync == "blp" and workers:
            plan = self.load_plan(field)
            if plan is not None:
                which = "plan" if self.plan is not None else "plan_file"
                have = {dc for _, dc in workers}
                if set(plan.dcs) != have:
                    raise ValidationError(f"{f}{which}.dcs", f"plan DCs {sorted(plan.dcs)} differ from the workers' "
                                          f"DCs {sorted(have)}", "plan for the DCs that hold the trainer hosts")


@dataclass
class DdpOverlapParams(PgcsParams):
    """DDP-style baseline: one expert per step, its gradient synchronized in ``buckets`` during backward.

    Buckets are contiguous ranges of the expert's flat gradient of at least
    ``n / buckets`` elements, in reverse parameter order (the order backward
    produces them, as in PyTorch DDP's ``bucket_cap_mb``; a parameter is
    never split, so the count is about ``buckets``); a bucket is handed to the communication thread once every
    parameter in it has its gradient, and the optimizer step waits for all
    of them.  ``overlap`` must stay true here.
    """

    overlap_kind: ClassVar[str] = "buckets"

    buckets: int = 4

    def check(self, field: str) -> None:
        f = f"{field}." if field else ""
        if self.buckets < 1:
            raise ValidationError(f"{f}buckets", f"must be >= 1, got {self.buckets}", "use e.g. 4")
        if not self.overlap:
            raise ValidationError(f"{f}overlap", "ddp_overlap always overlaps",
                                  "use scheme pgcs with overlap: false for the sequential baseline")
        super().check(field)
