"""The number a message of fields appended to a step (``add_fields``) takes in a store,
and what a sidecar left at that number by a killed stage means.

A message is ``step-SSSSSSSS.rank-RRRR.fields-NNN.rlw`` (its sidecar, when it has one,
``….fields-NNN.sidecar.rlw``, committed first). Readers count the messages by their main
files, 0, 1, … until one is missing; a writer takes the lowest number with no main file,
which is that count (a file left beyond a gap by a stage that raced the step's deletion
aside: readers never look there).

A stage killed between the commit of its sidecar and that of its main file leaves the
sidecar with no main file: its number is free, as a part's is after a killed commit.
Its sidecar cannot be told from that of a stage still alive, about to commit its main
file, so nobody removes it before a main file of that number is committed. The writer
that takes the number writes its message without a sidecar (all its fields in the main
file: the sidecar's name is taken), and, once its main file is committed, removes the
sidecar, which no main file can refer to any more: a live stage's commit of that number
now fails (another stage took it), and it takes the next number, as after any collision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from rlwire._frame.frame import Frame
from rlwire.transport._stored.names import FIELDS_RE

__all__ = ["next_number", "without_sidecar"]


def next_number(names: Iterable[str], step: int, rank: int) -> tuple[int, bool]:
    """The number the next message of fields appended to ``step`` for ``rank`` takes,
    given the destination's ``names``, and whether a sidecar with no main file stands
    there (a stage killed between its two commits, or one committing at this moment).

    Example:
        >>> next_number(["step-00000003.rank-0000.fields-000.rlw"], 3, 0)
        (1, False)
        >>> next_number(["step-00000003.rank-0000.fields-000.sidecar.rlw"], 3, 0)
        (0, True)
    """
    mains: set[int] = set()
    sides: set[int] = set()
    for name in names:
        m = FIELDS_RE.fullmatch(name)
        if m and (int(m.group(1)), int(m.group(2))) == (step, rank):
            (sides if m.group(4) else mains).add(int(m.group(3)))
    number = min(set(range(len(mains) + 1)) - mains)
    return number, number in sides


def without_sidecar(frame: Frame) -> Frame:
    """``frame`` with every buffer in the main file (the sidecar's name is taken).

    Example:
        >>> frame = Frame(b"h", (memoryview(b"a"), memoryview(b"b")), sidecar=frozenset({1}))
        >>> without_sidecar(frame).sidecar
        frozenset()
    """
    return dataclasses.replace(frame, sidecar=frozenset())
