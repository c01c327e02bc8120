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

from collections.abc import Iterable

from rlwire._api.decoding import FrameDecoding
from rlwire._core.errors import ConfigError
from rlwire._core.slicing import run_sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selection

__all__ = ["AppendedSelector", "FieldSelector", "check_fields"]


def check_fields(fields: Iterable[str] | None) -> frozenset[str] | None:
    """``fields`` as a set of names, or ``None`` when not given.

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
    return names


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

    def __call__(self, frame: Frame) -> Selection | None:
        codec = self.decoding.codec(frame.codec)
        describe = getattr(codec, "describe_columns", None)
        if describe is None:
            return None
        table = describe(run_sliced(self.decoding.decompressed(frame)))
        if table is None or any(c.name in self.fields for c in table.columns):
            return None
        return Selection(frozenset())
