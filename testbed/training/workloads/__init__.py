"""Workload registry: name -> (params dataclass, lazily imported builder).

``build_workload(cfg, num_shards)`` returns a :class:`~testbed.training.workloads.base.Workload`
(imports torch).  Names and parameters validate without torch.
"""

from __future__ import annotations

from typing import Any

from testbed.training.registry import Registry
from testbed.training.workloads.params import CharLMParams, DigitsParams, SyntheticParams

WORKLOADS = Registry("workload")
WORKLOADS.register("digits", DigitsParams, "testbed.training.workloads.digits:DigitsWorkload",
                   "MLP/CNN on sklearn's bundled 8x8 digits; held-out accuracy")
WORKLOADS.register("charlm", CharLMParams, "testbed.training.workloads.charlm:CharLMWorkload",
                   "tiny char-level transformer on the stdlib's .py sources; held-out loss")
WORKLOADS.register("synthetic", SyntheticParams, "testbed.training.workloads.synthetic:SyntheticWorkload",
                   "chosen gradient size and compute time")
from testbed.training.workloads.experts_params import ExpertsParams  # noqa: E402

WORKLOADS.register("experts", ExpertsParams, "testbed.training.workloads.experts:ExpertsWorkload",
                   "E char-LM experts on different stdlib domains (PGCS); held-out loss per expert")


def build_workload(name: str, params: Any, seed: int) -> Any:
    """Instantiate workload ``name`` with validated ``params`` (imports torch)."""
    return WORKLOADS.load(name)(params, seed)


__all__ = ["WORKLOADS", "build_workload"]
