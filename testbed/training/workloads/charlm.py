"""``charlm``: a tiny character-level causal transformer on the stdlib's own sources.

Reusable pieces (a multi-expert LM for PGCS builds on them):

* :class:`TinyCharTransformer` - pre-norm decoder-only transformer, tied
  input/output embedding, learned positions; ~46k parameters at the
  defaults (d_model 48, 2 layers, 4 heads, seq_len 64), so one step of 16
  sequences takes tens of ms on one CPU thread.
* :func:`stdlib_corpus` (re-exported from ``stdlib_text``) - deterministic
  train/held-out text of a stdlib *domain*.
* :class:`CharLMWorkload` - batches, loss and held-out evaluation over a
  corpus; ``domain`` picks the text.

Held-out metrics: mean next-character cross-entropy (``loss``, nats) and
next-character accuracy (``acc``) on non-overlapping windows of files that
were never trained on.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from testbed.training.workloads.base import Batch, Workload, init_like_default, seeded_init
from testbed.training.workloads.params import CharLMParams
from testbed.training.workloads.stdlib_text import (
    DOMAINS,
    VOCAB_SIZE,
    Corpus,
    decode,
    encode,
    stdlib_corpus,
)

__all__ = ["TinyCharTransformer", "CharLMWorkload", "stdlib_corpus", "Corpus", "DOMAINS", "VOCAB_SIZE",
           "encode", "decode", "lm_windows"]


class CausalBlock(nn.Module):
    """Pre-norm self-attention + feed-forward block with a causal mask."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, d_ff)
        self.ff2 = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        shape = (b, t, self.n_heads, c // self.n_heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class TinyCharTransformer(nn.Module):
    """Decoder-only character LM: ids (B, T) -> logits (B, T, vocab)."""

    def __init__(self, vocab_size: int = VOCAB_SIZE, seq_len: int = 64, d_model: int = 48, n_heads: int = 4,
                 n_layers: int = 2, d_ff: int = 96, seed: int | None = None) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(CausalBlock(d_model, n_heads, d_ff) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if seed is not None:
            init_like_default(self, seeded_init(seed))
        self.head.weight = self.tok.weight  # tied: fewer parameters, better for tiny models

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def lm_windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input/target pairs of length ``seq_len`` starting at ``offsets``."""
    idx = offsets[:, None] + np.arange(seq_len + 1)[None, :]
    w = torch.from_numpy(tokens[idx])
    return w[:, :-1], w[:, 1:]


def lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class CharLMWorkload(Workload):
    name = "charlm"
    has_accuracy = True

    def __init__(self, params: CharLMParams, seed: int) -> None:
        super().__init__(params, seed)
        self.corpus = stdlib_corpus(params.domain, params.train_chars, params.eval_chars)
        if len(self.corpus.train) <= params.seq_len + 1:
            raise ValueError(f"charlm: training text shorter than seq_len for domain {params.domain!r}")
        n_windows = max(1, (len(self.corpus.held_out) - 1) // (params.seq_len + 1))
        offsets = np.arange(n_windows) * (params.seq_len + 1)
        self.held = lm_windows(self.corpus.held_out, offsets, params.seq_len)

    def build_model(self) -> nn.Module:
        p = self.params
        return TinyCharTransformer(VOCAB_SIZE, p.seq_len, p.d_model, p.n_heads, p.n_layers, p.d_ff, seed=self.seed)

    def batch(self, step: int, shard: int, num_shards: int) -> Batch:
        b, t = self.batch_size, self.params.seq_len
        g = np.random.default_rng([self.seed, step])
        offsets = g.integers(0, len(self.corpus.train) - t - 1, size=num_shards * b)[shard * b:(shard + 1) * b]
        return lm_windows(self.corpus.train, offsets, t)

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return lm_loss(model, batch)

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float | None]:
        dev = next(model.parameters()).device
        x, y = (z.to(dev) for z in self.held)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        acc = (logits.argmax(-1) == y).float().mean()
        return {"loss": float(loss), "acc": float(acc)}

    def describe(self) -> dict[str, object]:
        c = self.corpus
        return {"name": self.name, "domain": c.domain, "train_chars": len(c.train), "held_out_chars": len(c.held_out),
                "train_files": len(c.train_files), "held_out_files": len(c.held_out_files),
                "fingerprint": c.fingerprint}
