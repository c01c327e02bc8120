"""Received data converted into the type a receiver asked for: long lists in groups, and
out-of-band bytes copied (or not) as the annotation wants them.

Example:
    >>> convert([1, 2], list[float])
    [1.0, 2.0]
    >>> convert(["x"], list[int])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    rlwire.errors.DecodeError: received data does not match list[int]: Expected `int`, got `str` ...
"""

from __future__ import annotations

import re
import typing
from typing import Any

import msgspec

from rlwire._core.built import dec_hook, type_name
from rlwire._core.copying import copied
from rlwire._core.errors import DecodeError
from rlwire._core.slicing import Sliced, SliceTimer

__all__ = ["ITEMWISE_ITEMS", "as_annotated", "convert", "converted", "dec_hook", "type_name"]

#: A list this long or longer is converted to ``list[T]`` in groups of
#: :data:`_CONVERT_GROUP` items, several groups to a time slice.
ITEMWISE_ITEMS = 64
_CONVERT_GROUP = 16


def converted(raw: Any, annotation: Any, timer: SliceTimer) -> Sliced[Any]:
    """``raw`` (plain builtins) converted to ``annotation`` (None: left as it is); a long
    list into ``list[T]`` in groups (see :data:`ITEMWISE_ITEMS`), yielding when ``timer``
    says a slice is over."""
    item = _list_item(annotation)
    if item is None or type(raw) is not list or len(raw) < ITEMWISE_ITEMS:
        return convert(raw, annotation)
    out: list[Any] = []
    for start in range(0, len(raw), _CONVERT_GROUP):
        group = raw[start : start + _CONVERT_GROUP]
        try:
            out += msgspec.convert(group, annotation, dec_hook=dec_hook)
        except msgspec.ValidationError as exc:
            where = _shift_index(str(exc), start)
            raise DecodeError(
                f"received data does not match {type_name(annotation)}: {where}"
            ) from exc
        if timer.due():
            yield
            timer.restart()
    return out


def convert(raw: Any, annotation: Any) -> Any:
    """``raw`` converted to ``annotation`` in one call (None: left as it is).

    Raises:
        DecodeError: ``raw`` does not match ``annotation``; names the path.
    """
    if annotation is None:
        return raw
    try:
        return msgspec.convert(raw, annotation, dec_hook=dec_hook)
    except msgspec.ValidationError as exc:
        raise DecodeError(f"received data does not match {type_name(annotation)}: {exc}") from exc


def as_annotated(view: memoryview, annotation: Any) -> Sliced[Any]:
    """Out-of-band bytes as a field annotated ``annotation`` wants them: the view itself
    (no copy) for ``memoryview`` or ``Any``, a copy for ``bytes`` or ``bytearray`` (made
    with the GIL released, a slice at a time)."""
    members = {annotation, *typing.get_args(annotation)}
    if memoryview in members or Any in members or object in members:
        return view
    if bytes in members:
        return (yield from copied(view, bytes))
    if bytearray in members:
        return (yield from copied(view, bytearray))
    return convert(view, annotation)  # raises DecodeError naming the mismatch


def _shift_index(message: str, by: int) -> str:
    """A msgspec error message about a group of a list's items, with its path made the whole
    list's: ``$[i]`` becomes ``$[by + i]``."""
    return re.sub(r" - at `\$\[(\d+)\]", lambda m: f" - at `$[{by + int(m[1])}]", message, count=1)


def _list_item(annotation: Any) -> Any:
    """``T`` of an annotation ``list[T]``, else None."""
    if typing.get_origin(annotation) is list:
        args = typing.get_args(annotation)
        return args[0] if args else None
    return None
