"""Partial reads by field: ``open_receiver(url, fields=("token_ids", "advantages"))``.

A receiver with ``fields`` returns each step (and each part) as ``as_columns=True``
does, with only the named columns in each list of samples stored column by column
(:class:`~rlwire.Columns`). Its source reads only what those columns need: the
receiver hands the source a :class:`FieldSelector`, which reads the codec header the
source read first and answers which buffers to read (:mod:`rlwire._frame.selection`).
Files map only those buffers' pages, S3 fetches only their byte ranges, ZeroMQ drops
the other buffers' frames on arrival; sources that cannot read part of a message (Ray,
plugins) read it whole, and the decode keeps the named columns all the same.
"""

from __future__ import annotations

import typing
from collections.abc import Container, Iterable
from typing import Any

import msgspec

from rlwire._api.decoding import FrameDecoding
from rlwire._core.errors import ConfigError
from rlwire._core.slicing import run_sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selection

__all__ = ["AppendedSelector", "FieldNames", "FieldSelector", "check_fields"]


def check_fields(fields: Iterable[str] | None, type_: Any = None) -> frozenset[str] | None:
    """``fields`` as a set of names, or ``None`` when not given. A name that is the
    attribute name of a renamed field of the samples of ``type_`` (the receiver's: a
    Struct with ``rename="camel"`` stores ``token_ids`` as ``tokenIds``) is taken as
    the name the field is stored under, as ``sidecar=`` takes either.

    Raises:
        ConfigError: not a non-empty collection of strings (a lone string too, which
            would otherwise be read letter by letter).

    Example:
        >>> sorted(check_fields(("token_ids", "advantages")))
        ['advantages', 'token_ids']
    """
    if fields is None:
        return None
    if isinstance(fields, str | bytes):
        raise ConfigError(f"fields must be a collection of field names, got {fields!r}")
    try:
        names = frozenset(fields)
    except TypeError:
        raise ConfigError(f"fields must be a collection of field names, got {fields!r}") from None
    if not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"fields must be one or more field names (str), got {fields!r}")
    fields_of = [f for kind in _sample_structs(type_) for f in msgspec.structs.fields(kind)]
    stored = {f.encode_name for f in fields_of}  # a name stored is read as it is
    renamed = {f.name: f.encode_name for f in fields_of if f.name not in stored}
    return FieldNames(names, renamed)


class FieldNames(frozenset[str]):
    """The names a receiver's ``fields=`` reads, as stored, and ``attributes``: the
    attribute name of each of them that is a renamed field of the receiver's samples.
    A field appended to a step under its attribute name (a stage appending
    ``ref_logprobs`` to samples that store it as ``refLogprobs``, left empty) is read
    as the stored one, by either name."""

    attributes: dict[str, str]

    def __new__(cls, names: Iterable[str], renamed: dict[str, str]) -> FieldNames:
        """``names`` as given; ``renamed``: attribute name -> stored name."""
        self = super().__new__(cls, (renamed.get(n, n) for n in names))
        self.attributes = {stored: name for name, stored in renamed.items() if stored in self}
        return self

    def spellings(self) -> frozenset[str]:
        """The names, and their attribute names."""
        return frozenset(self) | frozenset(self.attributes.values())

    def as_stored(self, columns: dict[str, Any]) -> dict[str, Any]:
        """``columns`` (appended to a step), a column of an attribute name named as
        stored."""
        back = {name: stored for stored, name in self.attributes.items()}
        return {back.get(k, k): v for k, v in columns.items()}


def _sample_structs(type_: Any) -> list[type[msgspec.Struct]]:
    """The Struct types a receiver of ``type_`` decodes samples into: the items of its
    lists (``type_`` a list, or a Struct's list fields), members of a union too."""
    if typing.get_origin(type_) is list:
        lists = list(typing.get_args(type_))
    elif isinstance(type_, type) and issubclass(type_, msgspec.Struct):
        hints = [f.type for f in msgspec.structs.fields(type_)]  # resolved by msgspec
        lists = [a for h in hints if typing.get_origin(h) is list for a in typing.get_args(h)]
    else:
        return []
    items = [m for a in lists for m in (typing.get_args(a) or (a,))]
    return [m for m in items if isinstance(m, type) and issubclass(m, msgspec.Struct)]


class FieldSelector:
    """The :data:`~rlwire._frame.selection.Selector` of a receiver opened with
    ``fields``: decompresses what the source read so far (the header, some buffers),
    and asks the codec the frame names which buffers its decode with those fields needs.
    A codec that cannot tell (a plugin, JSON) gets every buffer read.

    Raises:
        FieldNotFoundError: from a call, when the step lacks one of the fields.
    """

    def __init__(self, decoding: FrameDecoding, fields: frozenset[str]) -> None:
        self.decoding = decoding
        self.fields = fields

    def __call__(self, frame: Frame) -> Selection | None:
        codec = self.decoding.codec(frame.codec)
        select = getattr(codec, "select_fields", None)
        if select is None:
            return None
        got: Selection | None = select(run_sliced(self.decoding.decompressed(frame)), self.fields)
        return got


class AppendedSelector(FieldSelector):
    """The :data:`~rlwire._frame.selection.Selector` of a message of appended fields
    read by a receiver opened with ``fields``: no buffer of a message whose columns
    are none of the fields, every buffer of one that holds some (they are decoded
    whole). A codec that cannot list a message's columns gets every buffer read."""

    def __init__(
        self, decoding: FrameDecoding, fields: frozenset[str], known: Container[bytes] = ()
    ) -> None:
        super().__init__(decoding, fields)
        #: The ids of messages read already (while the receiver waits): none of their
        #: buffers is read again.
        self.known = known

    def __call__(self, frame: Frame) -> Selection | None:
        if frame.message_id and frame.message_id in self.known:
            return Selection(frozenset())
        codec = self.decoding.codec(frame.codec)
        describe = getattr(codec, "describe_columns", None)
        if describe is None:
            return None
        table = describe(run_sliced(self.decoding.decompressed(frame)))
        if table is None or any(c.name in self.fields for c in table.columns):
            return None
        return Selection(frozenset())
