"""The header of a Struct decoded with only the fields the receiving type knows: the
others are skipped in C, so that a header cannot make the reader build objects the type
would drop anyway.

Example:
    >>> import msgspec
    >>> class Old(msgspec.Struct):
    ...     a: int
    >>> fields = skeleton(Old)
    >>> raw = fields.decoder.decode(msgspec.msgpack.encode({"a": 1, "b": [0] * 3}))
    >>> fields.names, bytes(raw.f0)  # the field "b" is skipped, never built
    (('a',), b'\\x01')
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from rlwire._core.errors import DecodeError
from rlwire._core.slicing import Sliced
from rlwire.codecs._msgpack.conversion import type_name
from rlwire.codecs._msgpack.decode_calls import DecodeCalls

__all__ = ["Skeleton", "known_fields", "skeleton"]

#: First bytes of a msgpack extension value (fixext 1-16, ext 8/16/32).
_EXT_MARKERS = {bytes([b]) for b in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xC7, 0xC8, 0xC9)}


class Skeleton:
    """A Struct type's fields as :class:`msgspec.Raw` values, to decode its known
    fields only."""

    __slots__ = ("array_like", "cls", "decoder", "names", "tag", "tag_field")

    def __init__(self, cls: type[msgspec.Struct]) -> None:
        self.cls = cls
        config = cls.__struct_config__
        self.names = tuple(f.encode_name for f in msgspec.structs.fields(cls))
        self.array_like = config.array_like
        self.tag, self.tag_field = config.tag, config.tag_field
        fields = [
            (f"f{i}", msgspec.Raw | msgspec.UnsetType, msgspec.UNSET)
            for i in range(len(self.names))
        ]
        shape = msgspec.defstruct(
            f"{cls.__name__}Fields",
            fields,
            array_like=config.array_like,
            tag=config.tag,
            tag_field=config.tag_field,
            rename={f"f{i}": name for i, name in enumerate(self.names)},
        )
        self.decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(shape)


@functools.cache
def skeleton(annotation: type) -> Skeleton | None:
    """The skeleton of a Struct type that ignores unknown fields, else ``None``."""
    if not issubclass(annotation, msgspec.Struct):
        return None
    if annotation.__struct_config__.forbid_unknown_fields:
        return None
    return Skeleton(annotation)


def known_fields(header: bytes | memoryview, skeleton: Skeleton, calls: DecodeCalls) -> Sliced[Any]:
    """``header`` in plain builtins, with only the fields ``skeleton`` knows decoded (by
    ``calls``); None if it is not such a Struct's header (the plain decode then says what
    is wrong).

    Raises:
        DecodeError: the header is not the type's shape (said before building it).
    """
    try:
        raw = skeleton.decoder.decode(header)
    except msgspec.ValidationError as exc:
        if bytes(header[:1]) in _EXT_MARKERS:  # e.g. a heavy dict sent whole, chunked
            return None
        # Not the type's shape: say so now, without building what the header holds.
        raise DecodeError(f"received data does not match {type_name(skeleton.cls)}: {exc}") from exc
    except msgspec.DecodeError:
        return None  # malformed: the plain decode says where
    values = [getattr(raw, f"f{i}") for i in range(len(skeleton.names))]
    if skeleton.array_like:
        while values and values[-1] is msgspec.UNSET:
            values.pop()
        if msgspec.UNSET in values:
            return None
        out = [] if skeleton.tag is None else [skeleton.tag]
        for value in values:
            out.append((yield from calls.plain(value)))
        return out
    raw = {} if skeleton.tag is None else {skeleton.tag_field: skeleton.tag}
    for name, value in zip(skeleton.names, values, strict=True):
        if value is not msgspec.UNSET:
            raw[name] = yield from calls.plain(value)
    return raw
