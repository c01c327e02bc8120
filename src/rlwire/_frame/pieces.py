"""Pieces: one buffer of a Frame made of several runs of bytes, stored back to back.

A column of a list of samples (each sample's ``token_ids``, one after another) or a
chunked array (:class:`rlwire.Chunked`) is one buffer to the receiver, but its
bytes live in many arrays on the sending side. Joining them would copy the whole step
and hold it twice; instead the codec hands the sink the runs, and the sink writes them
one after another (``writev``), with no padding between them, as one buffer of the
message. What is stored is exactly the joined bytes: same length, same checksum, same
table entry, so a reader cannot tell, and gets one contiguous buffer.

Only sending sides see Pieces; a source always returns plain memoryviews. A sink that
cannot write runs (``Sink.gathers`` false, the default for plugins) gets them joined.

Example:
    >>> pieces = Pieces([memoryview(b"ab"), memoryview(b""), memoryview(b"cde")])
    >>> pieces.nbytes, len(pieces.runs)
    (5, 2)
    >>> bytes(pieces.joined())
    b'abcde'
"""

from __future__ import annotations

from collections.abc import Iterable

from rlwire._core.copying import concatenated
from rlwire._core.slicing import Sliced, run_sliced

__all__ = ["Pieces"]


class Pieces:
    """The runs of one buffer, in order: flat, C-contiguous byte views (format ``B``),
    empty runs dropped. They are not copied; their memory must stay unchanged until the
    message is sent, as for any buffer of a Frame.

    Attributes:
        runs: the non-empty runs.
        nbytes: their total length, the buffer's length.
    """

    __slots__ = ("nbytes", "runs")

    def __init__(self, runs: Iterable[memoryview]) -> None:
        kept = []
        for run in runs:
            if run.ndim != 1 or run.format != "B" or not run.c_contiguous:
                raise ValueError("a run of Pieces must be a flat, contiguous byte view")
            if run.nbytes:
                kept.append(run)
        self.runs: tuple[memoryview, ...] = tuple(kept)
        self.nbytes: int = sum(run.nbytes for run in kept)

    readonly = True  # as a memoryview of a sent buffer says: nothing writes to it

    def __len__(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        return f"Pieces({len(self.runs)} runs, {self.nbytes} bytes)"

    def joined_sliced(self) -> Sliced[memoryview]:
        """:meth:`joined` as a sliced generator: the copy releases the GIL and yields
        every few megabytes."""
        if len(self.runs) == 1:
            return self.runs[0]
        out = yield from concatenated(list(self.runs), self.nbytes)
        return memoryview(out)

    def joined(self) -> memoryview:
        """The bytes as one view: the single run itself, or a new copy of them all."""
        return run_sliced(self.joined_sliced())
