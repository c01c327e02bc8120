"""The out-of-band buffers of one frame being encoded: arrays and bytes values, and the
bulk buffer that holds the chunks of chunked containers.

Each array or large bytes value becomes a buffer of its own, and a small extension value
(:mod:`rlwire.codecs._msgpack.extensions`) takes its place in the header; one below the
inline threshold stays in the header.

Example:
    >>> import numpy as np
    >>> sent = SentBuffers(msgspec.msgpack.Encoder(), inline_threshold=16)
    >>> sent.array(np.zeros(8), None, side=False).code, sent.array(np.zeros(1), None, False).code
    (1, 2)
    >>> len(sent.buffers)
    1
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from rlwire._core.copying import concatenated
from rlwire._core.errors import EncodeError
from rlwire._core.paths import KeyPath, render_path
from rlwire._core.slicing import Sliced
from rlwire._frame.frame import as_byte_view
from rlwire._frame.pieces import Pieces
from rlwire.codecs._msgpack.arrays import PLAIN_DTYPES, byte_view, check_dtype, check_plain
from rlwire.codecs._msgpack.extensions import (
    EXT_ARRAY,
    EXT_BYTES,
    EXT_INLINE_ARRAY,
    ArrayRef,
    BytesRef,
    InlineArray,
)

__all__ = ["SentBuffers"]


class SentBuffers:
    """The buffers of one frame, in order, and which of them go to the sidecar."""

    def __init__(self, encoder: msgspec.msgpack.Encoder, inline_threshold: int) -> None:
        self.encoder = encoder
        self.inline_threshold = inline_threshold
        self.buffers: list[memoryview | Pieces] = []
        self.sidecar: list[int] = []
        # The chunks encoded so far, and their total size: one bytes object each, never
        # one growing bytearray, whose reallocations copy it whole under the GIL.
        self.bulk: list[bytes | memoryview] = []
        self.bulk_size = 0
        self.bulk_index = -1

    def add(self, view: memoryview | Pieces, side: bool) -> int:
        """Add a buffer (to the sidecar if ``side``); its index."""
        index = len(self.buffers)
        self.buffers.append(view)
        if side:
            self.sidecar.append(index)
        return index

    def array(self, arr: np.ndarray, path: KeyPath, side: bool) -> msgspec.msgpack.Ext:
        """The extension value that stands for ``arr``, out of band or inline."""
        if type(arr) is not np.ndarray:
            check_plain(arr, path)
        dtype = arr.dtype
        if dtype not in PLAIN_DTYPES:
            check_dtype(dtype, path)
        if arr.flags.c_contiguous:
            order, flat = "C", arr
        elif arr.flags.f_contiguous:
            order, flat = "F", arr.T
        else:
            order, flat = "C", np.ascontiguousarray(arr)
        if side or arr.nbytes >= self.inline_threshold:
            index = self.add(byte_view(flat), side)
            ref = ArrayRef(index, dtype.str, arr.shape, order)  # type: ignore[arg-type]
            return msgspec.msgpack.Ext(EXT_ARRAY, self.encoder.encode(ref))
        inline = InlineArray(dtype.str, arr.shape, order, flat.tobytes())  # type: ignore[arg-type]
        return msgspec.msgpack.Ext(EXT_INLINE_ARRAY, self.encoder.encode(inline))

    def bytes_value(
        self, obj: bytes | bytearray | memoryview, path: KeyPath, side: bool
    ) -> tuple[Any, int]:
        """``(what to encode in obj's place, its weight)``: an extension value when
        ``obj`` goes out of band, else ``obj`` itself."""
        try:
            view = memoryview(obj)
        except ValueError as exc:  # a released memoryview
            raise EncodeError(f"{render_path(path)}: cannot encode memoryview: {exc}") from None
        if not view.contiguous:
            raise EncodeError(
                f"{render_path(path)}: non-contiguous memoryview cannot be sent; "
                "copy it with bytes() first"
            )
        if side or view.nbytes >= self.inline_threshold:
            index = self.add(as_byte_view(view), side)
            return msgspec.msgpack.Ext(EXT_BYTES, self.encoder.encode(BytesRef(index))), 1
        inline = obj if isinstance(obj, bytes | bytearray) else view.tobytes()
        return inline, 1 + view.nbytes // 64

    def add_chunk(self, chunk: bytes) -> list[int]:
        """Add an encoded chunk to the bulk buffer (made on first use); its
        ``[start, end]`` there."""
        if self.bulk_index < 0:
            self.bulk_index = self.add(memoryview(b""), False)
        start = self.bulk_size
        self.bulk.append(chunk)
        self.bulk_size += len(chunk)
        return [start, self.bulk_size]

    def join_bulk(self) -> Sliced[None]:
        """Copy the chunks into the bulk buffer, with the GIL released, a slice at a time."""
        if self.bulk:
            joined = yield from concatenated(self.bulk, self.bulk_size)
            self.buffers[self.bulk_index] = memoryview(joined)
