"""Errors keep what they know when they cross a process boundary (pickled by a process
pool or multiprocessing), the one place rlwire objects are pickled, by users."""

from __future__ import annotations

import pickle

import pytest

import rlwire
from rlwire.transport import transport_error


@pytest.mark.parametrize(
    "error",
    [
        transport_error(OSError(28, "No space left on device"), "write", where="/run/p"),
        rlwire.StepGapError("expected step 4, got step 6", where="zmq+ipc:///s"),
        rlwire.CorruptFrameError("checksum mismatch", where="/run/x.rlw", segment=2),
        rlwire.EndOfStream.at(3, where="/run"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_survive_pickling_with_their_context(error: rlwire.RlwireError) -> None:
    error.add_context(step=5, rank=1)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert (copy.where, copy.step, copy.rank, copy.segment) == (
        error.where,
        error.step,
        error.rank,
        error.segment,
    )
    if isinstance(error, OSError):
        assert copy.errno == error.errno == 28
