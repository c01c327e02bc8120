"""Received arrays never view memory rlwire does not own (defect 13), and arrays that
carry more than their bytes are refused when sent (defect 14)."""

from __future__ import annotations

import sys
import textwrap

import forked
import numpy as np
import pytest

from rlwire import EncodeError
from rlwire.codecs import JsonCodec, MsgpackCodec
from rlwire.testing import make_batch

# Writes through each received one-element array as a library that ignores the
# read-only flag would (torch.from_numpy does), then checks CPython's cached bytes.
WRITE_THROUGH = textwrap.dedent(
    """
    import ctypes, sys
    import numpy as np
    from rlwire.codecs import MsgpackCodec
    codec = MsgpackCodec()
    for dtype in (np.bool_, np.uint8, np.int8):
        for value in (0, 1):
            got = codec.decode(codec.encode({"x": np.array([value], dtype)}))["x"]
            ctypes.memmove(got.ctypes.data, bytes([value ^ 0x55]), 1)
            if bytes([value])[0] != value:
                print(f"bytes([{value}]) changed through a received {np.dtype(dtype)} array")
                sys.exit(1)
    print("ok")
    """
)


def test_writing_through_a_received_one_byte_array_leaves_cpython_intact() -> None:
    """Defect 13: a one-element bool or uint8 array was a view over CPython's cached
    ``bytes([v])``: writing through it changed ``bytes([0])`` for the whole process."""
    proc = forked.run(
        [sys.executable, "-c", WRITE_THROUGH], capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr


@pytest.mark.parametrize("writable", [False, True])
def test_inline_arrays_own_their_memory(writable: bool) -> None:
    codec = MsgpackCodec()
    got = codec.decode(codec.encode({"x": np.arange(5, dtype=np.uint8)}), writable=writable)["x"]
    assert got.flags.owndata and got.flags.writeable == writable
    assert got.tolist() == [0, 1, 2, 3, 4]


def masked() -> np.ma.MaskedArray:
    return np.ma.masked_invalid(np.array([-0.5, np.nan, -1.25], np.float32))


@pytest.mark.parametrize("codec", [MsgpackCodec(), JsonCodec()], ids=["msgpack", "json"])
@pytest.mark.parametrize("big", [False, True], ids=["inline", "out-of-band"])
def test_masked_arrays_are_refused_when_sent(codec: object, big: bool) -> None:
    """Defect 14: a masked NaN logprob reached the trainer as 1e20 (the fill value)."""
    arr = np.ma.masked_invalid(np.full(5000 if big else 3, np.nan, np.float32))
    with pytest.raises(EncodeError, match=r"\$\.\w+.*masked arrays are not supported"):
        codec.encode({"logprobs": arr})  # type: ignore[attr-defined]


def test_a_training_batch_with_a_masked_field_is_refused() -> None:
    batch = make_batch(2, n=3)
    batch.samples[1].logprobs = masked()
    with pytest.raises(EncodeError, match="masked arrays are not supported"):
        MsgpackCodec().encode(batch)
