"""numpy values as JSON text: written by orjson, through the ``default`` hook, so that an
array is looked at before its text is written.

orjson writes numpy arrays and scalars itself (``OPT_SERIALIZE_NUMPY``), but only if
told to do so for the whole document, and then never shows them to the hook. JSON has no
shape: an array of shape ``(N, 0)`` is written as ``N`` empty lists, ``[],`` three bytes
each, although it holds no bytes at all, and ``N`` is bounded by nothing the sender
holds (``np.zeros((2**40, 0))`` takes no memory): orjson built some 1 GB to write 10
million of them, and aborted the process on 2**40. So the documents are written without
that option: the hook gets every numpy value, refuses an array holding no values whose
text would take over :data:`HOLLOW_TEXT` bytes (one that holds values writes at most a
list per value per axis: its text is bounded by its bytes), and hands the others back as
the text orjson writes for them (:class:`orjson.Fragment`), unchanged. This costs about a
microsecond per array or numpy scalar, and nothing for the rest of a document.

orjson writes a ``datetime64`` as an ISO string of microseconds at most: the nanoseconds
of a ``datetime64[ns]`` were cut off without a word. Units finer than microseconds are
refused (:func:`datetime_problem`), arrays and scalars alike, as the msgpack codec
refuses every ``datetime64``.

Example:
    >>> import numpy as np, orjson
    >>> orjson.dumps({"a": array_text(np.arange(3).reshape(3, 1))})
    b'{"a":[[0],[1],[2]]}'
    >>> hollow_text((3, 0))
    10
    >>> hollow_problem(np.zeros((10**6, 0)))[:60]
    'numpy array of shape (1000000, 0) holds no values, yet its J'
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

__all__ = [
    "HOLLOW_TEXT",
    "array_problem",
    "array_text",
    "datetime_problem",
    "hollow_problem",
    "hollow_text",
    "scalar_text",
]

#: The most bytes of JSON text an array holding no values may take (some 350,000 empty
#: lists).
HOLLOW_TEXT = 1 << 20
_NUMPY = orjson.OPT_SERIALIZE_NUMPY
_FINE_UNITS = frozenset(("ns", "ps", "fs", "as"))


def array_problem(arr: np.ndarray) -> str | None:
    """Why JSON cannot carry ``arr`` (its dtype, a masked array), or ``None``."""
    if isinstance(arr, np.ma.MaskedArray):
        return (
            "numpy masked arrays are not supported: the mask would be lost and the masked "
            "values written as data; write arr.filled(value) and the mask as arrays of "
            "their own"
        )
    dtype = arr.dtype
    if dtype.fields is None and dtype.subdtype is None:
        if dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize <= 8):
            return None
        if dtype.kind == "M":
            return datetime_problem(dtype)
        if dtype.kind == "f" or dtype.kind == "c":
            return (
                f"numpy arrays of dtype {dtype} are not supported (JSON numbers are "
                "float64 at most and not complex); convert the array first, e.g. "
                ".astype(np.float64)"
            )
    hint = (
        " (object arrays would need pickle, which rlwire never uses)" if dtype.kind == "O" else ""
    )
    return (
        f"numpy arrays of dtype {dtype} are not supported; only bool and numeric dtypes are{hint}"
    )


def datetime_problem(dtype: np.dtype[Any]) -> str | None:
    """Why JSON cannot carry values of the datetime64 ``dtype``, or None: orjson writes
    a datetime64 as an ISO string of microseconds at most, so it cut the digits of a
    finer unit off, without a word (``datetime64[ns]``), or refused it (``ps``, ``fs``,
    ``as``)."""
    unit = np.datetime_data(dtype)[0]
    if unit not in _FINE_UNITS:
        return None
    return (
        f"numpy {dtype} values are not supported: JSON writes a datetime64 as an ISO string "
        "of microseconds at most, so the finer digits would be lost; convert with "
        f".astype('datetime64[us]') if microseconds suffice, or send .view(np.int64) (the "
        f"{unit} since 1970)"
    )


def array_text(arr: np.ndarray) -> orjson.Fragment:
    """The JSON text orjson writes for ``arr`` (at least one dimension, a dtype it
    writes), in native byte order."""
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return orjson.Fragment(orjson.dumps(np.ascontiguousarray(arr), option=_NUMPY))


def scalar_text(value: np.generic) -> orjson.Fragment:
    """The JSON text orjson writes for a numpy scalar.

    Raises:
        TypeError: JSON cannot carry it; the message says why.
    """
    dtype = value.dtype
    problem = datetime_problem(dtype) if dtype.kind == "M" else None
    if problem is None:
        try:
            return orjson.Fragment(orjson.dumps(value, option=_NUMPY))
        except orjson.JSONEncodeError:
            pass
        problem = f"numpy scalar of dtype {dtype} has no JSON equivalent" + (
            "; convert it with float() first" if dtype.kind == "f" else ""
        )
    raise TypeError(problem)


def hollow_text(shape: tuple[int, ...]) -> int:
    """The bytes of JSON text an array of ``shape`` holding no values takes: ``[]`` for
    every list at every axis down to the first of length 0, and commas between them
    (exact: numpy keeps the product of the lengths before a 0 within 64 bits)."""
    lists = level = 1
    for length in shape[:-1]:
        if level * length == 0:
            break
        level *= length
        lists += level
    return 2 * lists + level - 1  # the commas: between the lists of the deepest level


def hollow_problem(arr: np.ndarray) -> str | None:
    """Why ``arr`` is refused, if it holds no values and its JSON text would take over
    :data:`HOLLOW_TEXT` bytes; else None."""
    if arr.size or arr.ndim < 2:
        return None
    text = hollow_text(arr.shape)
    if text <= HOLLOW_TEXT:
        return None
    return (
        f"numpy array of shape {arr.shape} holds no values, yet its JSON text would take "
        f"{_size(text)}, one empty list for each of its rows (JSON keeps no shape); an "
        f"array of no values may take {HOLLOW_TEXT >> 20} MiB of JSON at most. Send its "
        "shape instead, or drop the axis of length 0"
    )


def _size(text: int) -> str:
    """``text`` bytes, and in the largest binary unit it reaches."""
    unit = next(u for u in range(6, 0, -1) if text >= 1 << (10 * u))
    return f"{text:,} bytes ({text / (1 << (10 * unit)):.1f} {'KMGTPE'[unit - 1]}iB)"
