"""Shared helpers for the training tests: reading records, the single-process reference, replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def spans(out_dir: Path, role: str | None = None) -> list[dict[str, Any]]:
    out = []
    for f in sorted((Path(out_dir) / "events").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if role is None or rec["role"] == role:
                    out.append(rec)
    return out


def load_params(out_dir: Path, role: str, rank: int):  # noqa: ANN201 - torch tensor
    import torch

    return torch.load(Path(out_dir) / "models" / f"{role}.{rank}.pt")


def reference_params(cfg: dict[str, Any], workers: int, steps: int):  # noqa: ANN201
    """One process, one shard holding all ``workers`` batches per step: what BSP must equal."""
    from testbed.training.config import validate_training
    from testbed.training.flat import FlatModel, make_optimizer
    from testbed.training.workloads import build_workload

    tc = validate_training(cfg)
    params = tc.workload.params
    params.batch_size = params.batch_size * workers
    wl = build_workload(tc.workload.name, params, tc.seed)
    flat = FlatModel(wl.build_model())
    opt = make_optimizer(tc.optimizer, flat.plist)
    for step in range(steps):
        flat.zero_grad()
        wl.loss(flat.model, wl.batch(step, 0, 1)).backward()
        opt.step()
    return flat.params.clone()


def replay_server(cfg: dict[str, Any], applies: list[dict[str, Any]], members: list[list[int]], world: int):  # noqa: ANN201
    """Re-run the server's log of updates under the stated semantics.

    Update ``i`` (in applied order) is: the average of the gradients of the
    client's members' shards of step ``step``, evaluated on exactly the model
    version ``version`` it names, applied by the server's optimizer.
    """
    from testbed.training.config import validate_training
    from testbed.training.flat import FlatModel, make_optimizer
    from testbed.training.workloads import build_workload

    tc = validate_training(cfg)
    wl = build_workload(tc.workload.name, tc.workload.params, tc.seed)
    server = FlatModel(wl.build_model())
    opt = make_optimizer(tc.optimizer, server.plist)
    probe = FlatModel(wl.build_model())
    history = [server.params.clone()]
    for a in sorted(applies, key=lambda a: a["applied_version"]):
        assert a["applied_version"] == len(history)
        probe.load(history[a["version"]])
        total = None
        for r in members[a["client"]]:
            probe.zero_grad()
            wl.loss(probe.model, wl.batch(a["step"], r, world)).backward()
            total = probe.grads.clone() if total is None else total + probe.grads
        server.grads.copy_(total / len(members[a["client"]]))
        opt.step()
        history.append(server.params.clone())
    return server.params.clone()
