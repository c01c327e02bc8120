"""Test data shared by the test modules (the same helpers plugin authors get)."""

from __future__ import annotations

from rlwire.testing import assert_batches_equal, make_batch, make_sample

__all__ = ["assert_batches_equal", "make_batch", "make_sample"]
