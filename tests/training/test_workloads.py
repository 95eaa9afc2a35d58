"""Workloads in-process: sharding rule, corpus determinism, model sizes, synthetic timing, slowdown."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from testbed.training.workloads import WORKLOADS, build_workload  # noqa: E402

pytestmark = pytest.mark.torch


def make(name, **params):
    return build_workload(name, WORKLOADS.parse_params(name, params, "w"), seed=3)


@pytest.mark.parametrize("name", ["digits", "charlm"])
def test_shards_concatenate_to_the_global_batch(name):
    small, big = make(name, batch_size=4), make(name, batch_size=16)
    for step in (0, 1, 57):
        parts = [small.batch(step, r, 4) for r in range(4)]
        whole = big.batch(step, 0, 1)
        for i in range(len(whole)):
            assert torch.equal(torch.cat([p[i] for p in parts]), whole[i])
    assert not torch.equal(small.batch(0, 0, 4)[0], small.batch(1, 0, 4)[0])


def test_models_are_deterministic_and_small():
    a, b = make("charlm").build_model(), make("charlm").build_model()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    n = sum(p.numel() for p in a.parameters())
    assert 20_000 < n < 100_000, n
    x, y = make("charlm").batch(0, 0, 1)
    assert x.shape == (16, 64) and a(x).shape == (16, 64, 98)
    assert make("digits").evaluate(make("digits").build_model())["acc"] is not None


def test_stdlib_corpus_split_and_domains():
    from testbed.training.workloads.charlm import stdlib_corpus

    c = stdlib_corpus(None, 50_000, 4_096)
    again = stdlib_corpus.__wrapped__(None, 50_000, 4_096)  # bypass the cache: re-read the files
    assert c.fingerprint == again.fingerprint and np.array_equal(c.train, again.train)
    assert not set(c.train_files) & set(c.held_out_files)
    assert len(c.train) >= 50_000 and len(c.held_out) >= 4_096
    email, asyncio = stdlib_corpus("email", 20_000, 2_048), stdlib_corpus("asyncio", 20_000, 2_048)
    assert all(f.startswith("email/") for f in email.train_files)
    assert all(f.startswith("asyncio/") for f in asyncio.train_files)
    assert email.fingerprint != asyncio.fingerprint


def test_synthetic_size_and_compute_time():
    wl = make("synthetic", grad_bytes=4_000_000, compute_s=0.05, compute_mode="sleep")
    model = wl.build_model()
    assert sum(p.numel() for p in model.parameters()) * 4 == 4_000_000
    t = time.perf_counter()
    wl.loss(model, wl.batch(0, 0, 1)).backward()
    wl.pad_compute(time.perf_counter() - t)
    assert time.perf_counter() - t >= 0.05
    busy = make("synthetic", params=1000, compute_s=0.02, compute_mode="busy")
    t, c = time.perf_counter(), time.process_time()
    busy.pad_compute(0.0)
    assert time.perf_counter() - t >= 0.02 and time.process_time() - c > 0.005


def test_synthetic_layers_hold_the_same_vector():
    """``layers`` splits the one vector into parameter tensors (what DDP buckets divide); the values,
    the loss, the directly written gradient and the autograd one do not change."""
    one, eight = make("synthetic", params=10_001), make("synthetic", params=10_001, layers=8)
    m1, m8 = one.build_model(), eight.build_model()
    assert len(list(m1.parameters())) == 1 and len(list(m8.parameters())) == 8
    flat = torch.cat([p.detach() for p in m8.parameters()])
    assert torch.equal(flat, next(m1.parameters()).detach())
    batch = one.batch(3, 1, 2)
    for m in (m1, m8):
        for p in m.parameters():
            p.grad = torch.zeros_like(p)
    assert one.backward(m1, batch) == pytest.approx(eight.backward(m8, batch), rel=1e-6)
    torch.testing.assert_close(torch.cat([p.grad for p in m8.parameters()]), next(m1.parameters()).grad)
    auto = eight.build_model()
    eight.loss(auto, batch).backward()
    torch.testing.assert_close(torch.cat([p.grad for p in auto.parameters()]), next(m1.parameters()).grad)
    assert one.evaluate(m1)["loss"] == pytest.approx(eight.evaluate(m8)["loss"], rel=1e-6)


@pytest.mark.parametrize("layers", [0, 10_002])
def test_synthetic_layers_are_checked(layers):
    from testbed.training.schema import ValidationError

    with pytest.raises(ValidationError) as e:
        make("synthetic", params=10_001, layers=layers)
    assert e.value.field.endswith("layers")


def test_slowdown_model():
    from testbed.training.config import DelayDist
    from testbed.training.runtime import Slowdown

    assert Slowdown(3.0, [], 0).extra_s(0.1) == pytest.approx(0.2)
    exp = Slowdown(1.0, [DelayDist(dist="exponential", mean_s=0.01)], 0)
    draws = [exp.extra_s(0.0) for _ in range(4000)]
    assert np.mean(draws) == pytest.approx(0.01, rel=0.1)
    spiky = Slowdown(1.0, [DelayDist(dist="constant", value_s=1.0, prob=0.25)], 0)
    assert np.mean([spiky.extra_s(0.0) for _ in range(4000)]) == pytest.approx(0.25, abs=0.03)
