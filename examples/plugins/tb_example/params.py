"""Parameters of the example scheme and workload: dataclasses whose annotations are the schema.

``check(field)`` adds value constraints; errors name the field (``training.scheme.every``)
like every other spec error, and the command exits 2 before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from traffic_control.errors import ValidationError


@dataclass
class LocalSgdParams:
    """Average the models every ``every`` local steps (``every: 1`` is BSP on parameters)."""

    uses_server: ClassVar[bool] = False  # collectives only, no parameter server process
    every: int = 4

    def update_workers(self, world_size: int, groups: list[list[int]] | None = None) -> int:
        """Each local step uses one worker's batch, so ``lr_rule`` scales by 1, not by N
        (``testbed.training.lr``; without this method a scheme without a server counts N)."""
        return 1

    def check(self, field: str) -> None:
        if self.every < 1:
            raise ValidationError(f"{field}.every", f"must be at least 1, got {self.every}", "e.g. every: 4")


@dataclass
class LinRegParams:
    """``y = x . w* + noise`` with ``features`` inputs; ``batch_size`` samples per worker step."""

    features: int = 16
    batch_size: int = 16
    samples: int = 4096
    noise: float = 0.1

    def check(self, field: str) -> None:
        for name in ("features", "batch_size", "samples"):
            if getattr(self, name) < 1:
                raise ValidationError(f"{field}.{name}", "must be at least 1", f"e.g. {name}: 16")
