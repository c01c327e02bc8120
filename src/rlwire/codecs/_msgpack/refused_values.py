"""Values the msgpack codec refuses to send though msgspec would write them, and where in
a Struct it looks for them; and where a value msgspec refuses is (:func:`unencodable_path`).

* A :class:`msgspec.Raw` is bytes msgspec copies into the header unchecked: malformed, it
  made a step every reader refused; JSON text in it (``Raw(b"1")``) arrived as something
  else (49); an extension value in it was read as one of rlwire's.
* A :class:`msgspec.msgpack.Ext` is read back by the receiver's extension hook, which knows
  only rlwire's own types (1-7, :mod:`rlwire.codecs._msgpack.extensions`): any other code
  made a step every reader refused, and one of rlwire's read the user's payload as an
  array or a buffer.
* A numpy ``datetime64`` or ``timedelta64`` scalar has no plain number equivalent: its
  ``item()`` is an int for nanoseconds (it arrived as one, its unit and type lost, in a
  :class:`~rlwire.Columns` column too) and a ``datetime`` or ``timedelta`` for coarser
  units. Arrays of them are refused as every dtype but bool and numeric ones is
  (:mod:`rlwire.codecs._msgpack.arrays`).

Each is an :class:`~rlwire.EncodeError` naming its path, raised before anything is written.

Example:
    >>> class Tagged(msgspec.Struct):
    ...     tags: list[msgspec.msgpack.Ext]
    ...     ids: list[int]
    >>> walked_fields(Tagged)
    (('tags', 'tags', True), ('ids', 'ids', False))
    >>> scalar(np.float32(0.5), None)
    0.5
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import msgspec
import msgspec.inspect as mi
import numpy as np

from rlwire._core.errors import EncodeError
from rlwire._core.paths import KeyPath, render_path
from rlwire._core.types import buffer_fields, reachable

__all__ = ["REFUSED", "refuse", "scalar", "unencodable_path", "walked_fields"]

#: Types msgspec writes as they are, which the codec refuses (see :func:`refuse`).
REFUSED = (msgspec.Raw, msgspec.msgpack.Ext)


def refuse(obj: msgspec.Raw | msgspec.msgpack.Ext, path: KeyPath) -> EncodeError:
    """The error for a :data:`REFUSED` value ``obj`` found at ``path``."""
    if isinstance(obj, msgspec.msgpack.Ext):
        return EncodeError(
            f"{render_path(path)}: msgspec.msgpack.Ext values (here code {obj.code}) are not "
            "supported: rlwire reserves msgpack extension types for its own buffers; send "
            "the code and data as plain values (e.g. a tuple)"
        )
    return EncodeError(
        f"{render_path(path)}: msgspec.Raw values are not supported: their bytes would be "
        "written into the header unchecked; send the value they encode (msgspec.msgpack."
        "decode(raw)) or the bytes themselves (bytes(raw))"
    )


def _may_hold_refused(t: mi.Type) -> bool:
    return any(isinstance(inner, mi.RawType | mi.ExtType) for inner in reachable(t))


@functools.cache
def walked_fields(cls: type[msgspec.Struct]) -> tuple[tuple[str, str, bool], ...]:
    """``(attribute name, encoded name, walked)`` for each field of ``cls``, in order
    (:func:`~rlwire._core.types.buffer_fields`'s names): a field is walked
    when its annotation may hold a buffer (:func:`~rlwire._core.types.buffer_fields`) or a
    :data:`REFUSED` value at any depth (``list[msgspec.Raw]``, ``Ext | None``)."""
    fields = buffer_fields(cls)
    try:
        info = mi.type_info(cls)
    except Exception:  # buffer_fields walks such a type in full already
        return fields
    assert isinstance(info, mi.StructType)
    return tuple(
        (name, encoded, may_hold or _may_hold_refused(field.type))
        for (name, encoded, may_hold), field in zip(fields, info.fields, strict=True)
    )


def scalar(obj: np.generic, path: KeyPath) -> Any:
    """The plain number (or bool) a numpy scalar found at ``path`` is sent as.

    Raises:
        EncodeError: it has none (datetime64, timedelta64, complex, strings, ...); for a
            string (``np.str_``, ``np.bytes_``) the message says so, not that it has no
            number: it named a string "a numpy scalar of dtype <U2 with no plain number
            equivalent".
    """
    dtype = obj.dtype
    if dtype.kind in "mM":
        raise EncodeError(
            f"{render_path(path)}: numpy {dtype} values are not supported (they would "
            "arrive as plain ints or datetimes, their unit lost); send value.astype('int64') "
            "and the unit beside it"
        )
    if dtype.kind in "US":
        plain = "str" if dtype.kind == "U" else "bytes"
        raise EncodeError(
            f"{render_path(path)}: numpy {type(obj).__name__} values (dtype {dtype}) are not "
            f"supported: numpy scalars are sent as plain numbers; send {plain}(value)"
        )
    value = obj.item()
    if type(value) not in (bool, int, float):
        raise EncodeError(
            f"{render_path(path)}: numpy scalar of dtype {dtype} has no plain number "
            "equivalent"
            + ("; send it as a 0-d array (np.asarray(value))" if dtype.kind in "biufc" else "")
        )
    return value


def unencodable_path(encoder: msgspec.msgpack.Encoder, tree: Any, path: KeyPath) -> KeyPath:
    """The path of the first leaf of ``tree`` that ``encoder`` refuses (``path`` if none)."""
    if isinstance(tree, msgspec.Struct):
        items: Iterable[tuple[Any, Any]] = ((f, getattr(tree, f)) for f in tree.__struct_fields__)
    elif isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list | tuple):
        items = enumerate(tree)
    else:
        return path
    for key, item in items:
        try:
            encoder.encode(item)
        except (TypeError, ValueError, OverflowError):
            return unencodable_path(encoder, item, (path, key))
    return path
