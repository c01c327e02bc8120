"""Values a decoder has built already (numpy arrays, memoryviews), taken as they are when
msgspec converts a value into its annotation, and how an error names a type: shared by
the msgpack decoder and the fields a receiver appends to a step.

Example:
    >>> import msgspec, numpy as np
    >>> got = msgspec.convert({"x": np.arange(2)}, dict[str, np.ndarray], dec_hook=dec_hook)
    >>> got["x"].tolist()
    [0, 1]
"""

from __future__ import annotations

import types
import typing
from typing import Any

__all__ = ["dec_hook", "type_name"]


def dec_hook(tp: Any, obj: Any) -> Any:
    """msgspec's ``dec_hook``: arrays and memoryviews come out of the extension hook
    already built; accept them as they are."""
    if isinstance(tp, type) and isinstance(obj, tp):
        return obj
    raise TypeError(f"Expected `{type_name(tp)}`, got `{type(obj).__name__}`")


def type_name(tp: Any) -> str:
    """``tp`` as an error message names it: a generic with its arguments, which say
    which list (``list`` alone left a reader to guess).

    Example:
        >>> type_name(list[dict[str, int | None]]), type_name(tuple[float, ...])
        ('list[dict[str, int | None]]', 'tuple[float, ...]')
    """
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(map(type_name, args))
    if origin is not None and args:
        return f"{type_name(origin)}[{', '.join(map(type_name, args))}]"
    if tp is Ellipsis or tp is type(None):
        return "..." if tp is Ellipsis else "None"
    return getattr(tp, "__qualname__", None) or repr(tp)
