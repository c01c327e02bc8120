"""Synthetic batches and their comparison: used by the test suite, the CLI's demo and
plugin authors' tests (re-exported by :mod:`rlwire.testing`). Needs only numpy."""

from __future__ import annotations

import numpy as np

from rlwire._api.schema import TrainingBatch, TrainingSample

__all__ = ["assert_batches_equal", "make_batch", "make_sample"]


def make_sample(
    n: int = 16, *, layers: int = 4, topk: int = 2, seed: int = 0, routed: bool = True
) -> TrainingSample:
    """A valid :class:`~rlwire.TrainingSample` of ``n`` tokens with random contents,
    including ``routed_experts`` of shape ``(n, layers, topk)`` unless ``routed`` is false.

    Example:
        >>> make_sample(8).token_ids.shape
        (8,)
    """
    rng = np.random.default_rng(seed)
    return TrainingSample(
        token_ids=rng.integers(0, 50_000, n),
        mask=rng.random(n) < 0.7,
        logprobs=-rng.exponential(size=n).astype(np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=rng.standard_normal(n).astype(np.float32),
        env_name=f"env{seed}",
        routed_experts=rng.integers(0, 256, (n, layers, topk), dtype=np.uint8) if routed else None,
    )


def make_batch(
    count: int = 3, n: int = 16, seed: int = 0, *, layers: int = 4, topk: int = 2
) -> TrainingBatch:
    """A :class:`~rlwire.TrainingBatch` of ``count`` samples of ``n``, ``n + 1``, ... tokens,
    with ``routed_experts`` of ``layers`` x ``topk`` per token. The same arguments give
    the same bits; samples are seeded ``seed``, ``seed + 1``, ...

    Example:
        >>> batch = make_batch(2, seed=7)
        >>> [s.token_ids.size for s in batch.samples], batch.samples[0].routed_experts.shape
        ([16, 17], (16, 4, 2))
    """
    return TrainingBatch(
        samples=[make_sample(n + i, layers=layers, topk=topk, seed=seed + i) for i in range(count)]
    )


def assert_batches_equal(a: TrainingBatch, b: TrainingBatch) -> None:
    """Assert that two batches hold the same samples: every array with the same dtype,
    shape and bytes, every other field equal.

    Raises:
        AssertionError: naming the first field that differs.
    """
    assert len(a.samples) == len(b.samples), "different numbers of samples"
    for x, y in zip(a.samples, b.samples, strict=True):
        for field in x.__struct_fields__:
            u, v = getattr(x, field), getattr(y, field)
            if isinstance(u, np.ndarray):
                assert isinstance(v, np.ndarray), field
                assert u.dtype == v.dtype and u.shape == v.shape, field
                assert u.tobytes() == v.tobytes(), field
            elif field == "extras":
                assert u.keys() == v.keys(), field
                for key in u:
                    assert u[key].dtype == v[key].dtype, f"extras[{key!r}]"
                    assert u[key].tobytes() == v[key].tobytes(), f"extras[{key!r}]"
            else:
                assert u == v, field
