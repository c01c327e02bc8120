"""The marks beside the stored steps (docs/format.md): the end-of-stream mark a finished
sender leaves, and each rank's consumption mark. A mark is 16 bytes: magic (4), major and
minor version (u16 each), a step (u64), little-endian."""

from __future__ import annotations

import struct

from rlwire._core.errors import CorruptFrameError
from rlwire.transport._stored.layout import FORMAT_VERSION, check_magic

__all__ = ["CONSUMED_MAGIC", "END_MAGIC", "consumed_mark", "end_mark", "parse_mark"]

#: The end-of-stream mark records the end step; a rank's consumption mark the first
#: step it has not moved past.
END_MAGIC = b"RLWE"
CONSUMED_MAGIC = b"RLWC"
_MARK = struct.Struct("<4sHHQ")


def end_mark(end: int) -> bytes:
    """The bytes of the end-of-stream mark: no step at or after ``end`` will come."""
    return _MARK.pack(END_MAGIC, *FORMAT_VERSION, end)


def consumed_mark(next_step: int) -> bytes:
    """The bytes of a rank's consumption mark: its receiver moved past every step
    before ``next_step``."""
    return _MARK.pack(CONSUMED_MAGIC, *FORMAT_VERSION, next_step)


def parse_mark(data: memoryview | bytes | bytearray, magic: bytes, where: str) -> int:
    """The step a mark (:func:`end_mark` or :func:`consumed_mark`, by ``magic``) records.

    Raises:
        CorruptFrameError: ``data`` is not such a mark.
        UnsupportedVersionError: a major version this reader does not know.
    """
    what = "end mark" if magic == END_MAGIC else "consumption mark"
    if len(data) != _MARK.size:
        raise CorruptFrameError(
            f"a {what} is {_MARK.size} bytes, this one {len(data)}", where=where
        )
    found, major, _minor, step = _MARK.unpack_from(data)
    check_magic(found, major, expected=magic, known=FORMAT_VERSION[0], what=what, where=where)
    return int(step)
