"""Test data shared by the test modules."""

from __future__ import annotations

import numpy as np

import rlwire


def make_sample(
    n: int = 16, *, layers: int = 4, topk: int = 2, seed: int = 0, routed: bool = True
) -> rlwire.TrainingSample:
    """A valid TrainingSample with random contents."""
    rng = np.random.default_rng(seed)
    return rlwire.TrainingSample(
        token_ids=rng.integers(0, 50_000, n),
        mask=rng.random(n) < 0.7,
        logprobs=-rng.exponential(size=n).astype(np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=rng.standard_normal(n).astype(np.float32),
        env_name=f"env{seed}",
        routed_experts=rng.integers(0, 256, (n, layers, topk), dtype=np.uint8) if routed else None,
    )


def make_batch(count: int = 3, n: int = 16, seed: int = 0) -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[make_sample(n + i, seed=seed + i) for i in range(count)])


def assert_batches_equal(a: rlwire.TrainingBatch, b: rlwire.TrainingBatch) -> None:
    assert len(a.samples) == len(b.samples)
    for x, y in zip(a.samples, b.samples, strict=True):
        for field in x.__struct_fields__:
            u, v = getattr(x, field), getattr(y, field)
            if isinstance(u, np.ndarray):
                assert u.dtype == v.dtype and u.shape == v.shape, field
                assert u.tobytes() == v.tobytes(), field
            elif field == "extras":
                assert u.keys() == v.keys()
                for key in u:
                    assert u[key].tobytes() == v[key].tobytes() and u[key].dtype == v[key].dtype
            else:
                assert u == v, field
