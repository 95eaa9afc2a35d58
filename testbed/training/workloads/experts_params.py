"""Parameters of the ``experts`` workload (torch-free, so a spec validates without torch).

Our reading of PGCS (closed-access paper; docs/DESIGN.md "Training model"): the
model consists of E >= 2 *experts*, separate parameter sets trained
data-parallel across all DCs, each on its own text domain (as in
branch-train-merge).  Here every expert is a tiny character transformer of
``charlm`` with the same shape, trained on one stdlib domain
(``stdlib_text.DOMAINS``) and evaluated on held-out files of that domain.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.training.schema import ValidationError

__all__ = ["DEFAULT_DOMAINS", "ExpertsParams"]

#: Domains given to experts 0, 1, 2, ... when ``domains`` is not set.
DEFAULT_DOMAINS: tuple[str, ...] = ("email", "text", "asyncio", "web", "xml", "concurrency", "testing",
                                    "imports", "core")


@dataclass
class ExpertsParams:
    """E char-LM experts, expert ``k`` on ``domains[k]`` (default: ``DEFAULT_DOMAINS[:E]``).

    The model fields (``seq_len`` .. ``d_ff``) are shared by all experts;
    ``batch_size`` is sequences per worker per expert step.  ``domains``,
    when given, is the per-expert model config: its length must equal
    ``experts``.
    """

    experts: int = 3
    domains: list[str] | None = None
    batch_size: int = 16
    seq_len: int = 64
    d_model: int = 48
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 96
    train_chars: int = 300_000
    eval_chars: int = 16_384

    def check(self, field: str) -> None:
        f = f"{field}." if field else ""
        if self.experts < 2:
            raise ValidationError(f"{f}experts", f"must be >= 2, got {self.experts}",
                                  "a multi-expert model needs at least 2 experts (use charlm for one model)")
        if self.domains is None:
            if self.experts > len(DEFAULT_DOMAINS):
                raise ValidationError(f"{f}experts", f"{self.experts} experts but only {len(DEFAULT_DOMAINS)} "
                                      "default domains", "list a domain per expert in domains")
        elif len(self.domains) != self.experts:
            raise ValidationError(f"{f}domains", f"{len(self.domains)} domains for {self.experts} experts",
                                  "give exactly one domain per expert (or drop domains for the defaults)")
        else:
            from testbed.training.workloads.stdlib_text import DOMAINS

            for i, d in enumerate(self.domains):
                if d not in DOMAINS:
                    raise ValidationError(f"{f}domains[{i}]", f"unknown domain {d!r}",
                                          f"use one of {', '.join(sorted(DOMAINS))}")
        for name in ("batch_size", "seq_len", "d_model", "n_heads", "n_layers", "d_ff", "train_chars", "eval_chars"):
            if getattr(self, name) <= 0:
                raise ValidationError(f"{f}{name}", f"must be > 0, got {getattr(self, name)}",
                                      "use a positive value")
        if self.d_model % self.n_heads:
            raise ValidationError(f"{f}n_heads", f"d_model {self.d_model} is not divisible by {self.n_heads}",
                                  "pick n_heads dividing d_model")
        if self.eval_chars < 2 * self.seq_len:
            raise ValidationError(f"{f}eval_chars", "must be at least 2 x seq_len", "raise eval_chars")

    def expert_domains(self) -> list[str]:
        """The domain of every expert, in expert order."""
        return list(self.domains) if self.domains is not None else list(DEFAULT_DOMAINS[: self.experts])
