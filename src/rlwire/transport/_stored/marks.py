"""The marks beside the stored steps (docs/format.md): the end-of-stream mark a finished
sender leaves, each rank's consumption mark, and the mark of an overwrite or truncate
under way. A mark is 16 bytes: magic (4), major and
minor version (u16 each), a step (u64), little-endian.

A rank's part mark, beside its consumption mark, says how far into a step filled part by
part its receiver got: 24 bytes, magic (4), major and minor version (u16 each), a step
(u64) and a part (u64); since format 1.6, followed by the id of the part 0 the parts it
moved past followed (their run: a step sent again is another), where the receiver knows
it. It is a file of its own so that the consumption mark stays the 16 bytes every reader
(and every sender before parts) knows."""

from __future__ import annotations

import struct

from rlwire._core.errors import CorruptFrameError, StepExistsError
from rlwire.transport._stored.layout import (
    FORMAT_VERSION,
    PARTS_VERSION,
    TIED_PARTS_VERSION,
    check_magic,
)

__all__ = [
    "CONSUMED_MAGIC",
    "END_MAGIC",
    "MARK_BYTES",
    "MAX_MARK_BYTES",
    "PART_MAGIC",
    "REWRITE_MAGIC",
    "check_rewrite",
    "consumed_mark",
    "end_mark",
    "ended_at",
    "parse_mark",
    "parse_part_mark",
    "part_mark",
    "rewrite_mark",
    "too_long",
]

#: The end-of-stream mark records the end step; a rank's consumption mark the first
#: step it has not moved past.
END_MAGIC = b"RLWE"
CONSUMED_MAGIC = b"RLWC"
#: The rewrite mark records the first step an unfinished overwrite or truncate deletes.
REWRITE_MAGIC = b"RLWR"
#: A rank's part mark records a step and the first of its parts the receiver has not
#: moved past.
PART_MAGIC = b"RLWP"
_MARK = struct.Struct("<4sHHQ")
_PART_MARK = struct.Struct("<4sHHQQ")
#: More than any mark holds: a sink reads at most this much of a file at a mark's name,
#: so a large one is refused by its length without being read whole.
MAX_MARK_BYTES = 4096
#: The size of an end, consumption or rewrite mark.
MARK_BYTES = _MARK.size


def too_long(what: str, size: int | None, limit: int, where: str) -> CorruptFrameError:
    """The error for a file at the name of a ``what`` (a mark, a seal) of ``size`` bytes
    (``None``: more than ``limit``, not known how many), over the ``limit`` any is: it
    is refused by its size, not read (a sparse file of gigabytes would be mapped).

    Example:
        >>> str(too_long("end mark", 2**32, MARK_BYTES, "end.rlw"))
        'end.rlw: an end mark is at most 16 bytes, this one 4294967296: not read'
    """
    found = "longer" if size is None else str(size)
    a = "an" if what[0] in "aeiou" else "a"
    return CorruptFrameError(
        f"{a} {what} is at most {limit} bytes, this one {found}: not read", where=where
    )


def end_mark(end: int) -> bytes:
    """The bytes of the end-of-stream mark: no step at or after ``end`` will come."""
    return _MARK.pack(END_MAGIC, *FORMAT_VERSION, end)


def consumed_mark(next_step: int) -> bytes:
    """The bytes of a rank's consumption mark: its receiver moved past every step
    before ``next_step``."""
    return _MARK.pack(CONSUMED_MAGIC, *FORMAT_VERSION, next_step)


def part_mark(step: int, next_part: int, of: bytes = b"") -> bytes:
    """The bytes of a rank's part mark: its receiver moved past parts ``0`` to
    ``next_part - 1`` of ``step`` (it asked for part ``next_part``), which followed the
    part 0 whose id is ``of`` (``b""``: not known). It counts only beside a consumption
    mark of the same step.

    Example:
        >>> parse_part_mark(part_mark(7, 3, b"run"), "doc")
        (7, 3, b'run')
    """
    version = TIED_PARTS_VERSION if of else PARTS_VERSION
    return _PART_MARK.pack(PART_MAGIC, *version, step, next_part) + of


def rewrite_mark(first: int) -> bytes:
    """The bytes of the mark of an overwrite (``first`` 0) or truncate deleting every
    step from ``first`` on, while it is under way."""
    return _MARK.pack(REWRITE_MAGIC, *FORMAT_VERSION, first)


_WHAT = {END_MAGIC: "end mark", CONSUMED_MAGIC: "consumption mark", REWRITE_MAGIC: "rewrite mark"}


def parse_mark(data: memoryview | bytes | bytearray, magic: bytes, where: str) -> int:
    """The step a mark (:func:`end_mark` or :func:`consumed_mark`, by ``magic``) records.

    Raises:
        CorruptFrameError: ``data`` is not such a mark.
        UnsupportedVersionError: a major version this reader does not know.
    """
    what = _WHAT[magic]
    if len(data) != _MARK.size:
        raise CorruptFrameError(
            f"a {what} is {_MARK.size} bytes, this one {len(data)}", where=where
        )
    found, major, _minor, step = _MARK.unpack_from(data)
    check_magic(found, major, expected=magic, known=FORMAT_VERSION[0], what=what, where=where)
    return int(step)


def ended_at(data: memoryview | bytes | bytearray | None, where: str) -> int:
    """The step the end mark ``data`` gives, where ``"resume"`` goes on from at the
    least (a stream finished past its last step); 0 if it is gone (``None``) or garbled:
    ``"resume"`` deletes it, so it tells nothing more.

    Raises:
        UnsupportedVersionError: a major version this reader does not know.
    """
    try:
        return 0 if data is None else parse_mark(data, END_MAGIC, where)
    except CorruptFrameError:
        return 0


def check_rewrite(
    data: memoryview | bytes | bytearray, on_existing: str, first: int | None, where: str
) -> None:
    """Refuse to open with ``on_existing`` (deleting from ``first``) in a way that would
    leave the steps of the unfinished overwrite or truncate whose rewrite mark is
    ``data`` to receivers.

    Raises:
        StepExistsError: ``on_existing`` is ``"error"`` or ``"resume"``, or a truncate
            keeping steps the unfinished one deletes; the message names the repair.
        CorruptFrameError: ``data`` is no rewrite mark.
    """
    low = parse_mark(data, REWRITE_MAGIC, where)
    if on_existing in ("overwrite", "truncate") and first is not None and first <= low:
        return  # it deletes at least what the unfinished one did: it finishes the job
    what = "an overwrite" if low == 0 else f"a truncate from step {low}"
    repair = "on_existing='overwrite'" if low == 0 else f"start_step={low}, on_existing='truncate'"
    raise StepExistsError(
        f"{what} was cut short (a sender killed while deleting the steps of an earlier "
        f"run): the steps left must not be sent as this run's; open the sender with "
        f"{repair} to finish it",
        where=where,
    )


def parse_part_mark(data: memoryview | bytes | bytearray, where: str) -> tuple[int, int, bytes]:
    """The step, next part and part 0's id (``b""`` if it names none) a part mark
    (:func:`part_mark`) records.

    Raises:
        CorruptFrameError: ``data`` is not a part mark.
        UnsupportedVersionError: a major version this reader does not know.
    """
    if not _PART_MARK.size <= len(data) <= MAX_MARK_BYTES:
        raise CorruptFrameError(
            f"a part mark is {_PART_MARK.size} to {MAX_MARK_BYTES} bytes, this one {len(data)}",
            where=where,
        )
    found, major, minor, step, part = _PART_MARK.unpack_from(data)
    check_magic(
        found, major, expected=PART_MAGIC, known=PARTS_VERSION[0], what="part mark", where=where
    )
    of = bytes(data[_PART_MARK.size :])
    if of and minor < TIED_PARTS_VERSION[1]:
        raise CorruptFrameError(
            f"a part mark of version {major}.{minor} is {_PART_MARK.size} bytes, this one "
            f"{len(data)}",
            where=where,
        )
    return int(step), int(part), of
