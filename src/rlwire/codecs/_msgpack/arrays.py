"""numpy arrays and their bytes, both ways: the bytes of an array to send, an array over
received bytes, with every descriptor checked first.

Only bool and numeric dtypes travel: anything else would need pickle.

Example:
    >>> import numpy as np
    >>> sent = np.arange(6, dtype="<i4").reshape(2, 3)
    >>> check_dtype(sent.dtype, None)
    >>> make_array(byte_view(sent), "<i4", [2, 3], "C", writable=False)
    array([[0, 1, 2],
           [3, 4, 5]], dtype=int32)
"""

from __future__ import annotations

import math
import re
import sys
from typing import Any

import numpy as np

from rlwire._core.errors import CorruptFrameError, EncodeError
from rlwire._core.paths import KeyPath, render_path

__all__ = ["PLAIN_DTYPES", "byte_view", "check_dtype", "check_plain", "make_array"]

# -- sending --------------------------------------------------------------------------

#: dtypes already checked: bool and numeric, no fields, no sub-arrays.
PLAIN_DTYPES: set[np.dtype[Any]] = set()


def check_dtype(dtype: np.dtype[Any], path: KeyPath) -> None:
    """Raise :class:`EncodeError` unless arrays of ``dtype`` can travel."""
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        hint = (
            " (object arrays would need pickle, which rlwire never uses)"
            if dtype.kind == "O"
            else ""
        )
        raise EncodeError(
            f"{render_path(path)}: numpy arrays of dtype {dtype} are not "
            f"supported; only bool and numeric dtypes are{hint}"
        )
    PLAIN_DTYPES.add(dtype)


def check_plain(arr: np.ndarray, path: KeyPath) -> None:
    """Raise :class:`EncodeError` if ``arr`` carries more than its bytes: a masked
    array's mask would be dropped, and its masked values (a NaN, say) received as
    data."""
    if isinstance(arr, np.ma.MaskedArray):
        raise EncodeError(
            f"{render_path(path)}: numpy masked arrays are not supported: the mask "
            "would be lost and the masked values received as data; send "
            "arr.filled(value) and the mask (np.ma.getmaskarray(arr)) as arrays of their own"
        )


def byte_view(flat: np.ndarray) -> memoryview:
    """The bytes of a contiguous array, without a copy."""
    try:
        return flat.data.cast("B")  # the quick way; not for empty or non-native long doubles
    except (TypeError, ValueError):
        return flat.reshape(-1).view(np.uint8).data


# -- receiving ------------------------------------------------------------------------

_MAX_NDIM = 64
_DTYPE_RE = re.compile(r"[<>|=][biufc][0-9]{1,2}")
# Parsed dtypes by string. Bounded: _DTYPE_RE admits at most a few thousand strings.
_DTYPES: dict[str, np.dtype[Any]] = {}


def _dtype(dtype_str: str) -> np.dtype[Any]:
    dtype = _DTYPES.get(dtype_str)
    if dtype is None:
        if not _DTYPE_RE.fullmatch(dtype_str):
            raise CorruptFrameError(
                f"array descriptor: dtype {dtype_str!r} is not a plain bool or numeric dtype"
            )
        try:
            dtype = np.dtype(dtype_str)
        except TypeError as exc:
            raise CorruptFrameError(f"array descriptor: invalid dtype {dtype_str!r}") from exc
        _DTYPES[dtype_str] = dtype
    return dtype


def make_array(
    buf: memoryview, dtype_str: str, shape: list[int], order: str, writable: bool
) -> np.ndarray:
    """The array a descriptor describes, a view over ``buf`` (a copy if ``writable`` and
    ``buf`` is read-only).

    Raises:
        CorruptFrameError: the descriptor is malformed or does not match ``buf``.
    """
    dtype = _DTYPES.get(dtype_str) or _dtype(dtype_str)
    if len(shape) == 1 and order == "C" and 0 <= shape[0] * dtype.itemsize == buf.nbytes:
        arr = np.frombuffer(buf, dtype=dtype, count=shape[0])  # the common case, quickly
    else:  # the general case, which also says what is wrong
        arr = _shaped_array(buf, dtype, dtype_str, shape, order)
    if writable and not arr.flags.writeable:
        arr = arr.copy(order="K")
    return arr


def _shaped_array(
    buf: memoryview, dtype: np.dtype[Any], dtype_str: str, shape: list[int], order: str
) -> np.ndarray:
    if len(shape) > _MAX_NDIM or (shape and (min(shape) < 0 or max(shape) > sys.maxsize)):
        raise CorruptFrameError(f"array descriptor: invalid shape {shape}")
    count = math.prod(shape)
    if count * dtype.itemsize != buf.nbytes:
        raise CorruptFrameError(
            f"array descriptor: shape {shape} of {dtype_str} needs "
            f"{count * dtype.itemsize} bytes but its buffer has {buf.nbytes}"
        )
    if order not in ("C", "F"):
        raise CorruptFrameError(f"array descriptor: invalid order {order!r}")
    arr = np.frombuffer(buf, dtype=dtype, count=count)
    try:
        return arr.reshape(shape) if order == "C" else arr.reshape(shape[::-1]).T
    except ValueError as exc:  # e.g. a zero-size shape with a dimension numpy refuses
        raise CorruptFrameError(f"array descriptor: invalid shape {shape}: {exc}") from None
