"""Pieces: one buffer of a Frame made of several runs of bytes, stored back to back.

A column of a list of samples (each sample's ``token_ids``, one after another) or a
chunked array (:class:`rlwire.Chunked`) is one buffer to the receiver, but its
bytes live in many arrays on the sending side. Joining them would copy the whole step
and hold it twice; instead the codec hands the sink the runs, and the sink writes them
one after another (``writev``), with no padding between them, as one buffer of the
message. What is stored is exactly the joined bytes: same length, same checksum, same
table entry, so a reader cannot tell, and gets one contiguous buffer.

Runs that are adjacent views of one block (``values[0:5]`` and ``values[5:9]`` of one
array, say) are merged into one run, so data the sender already holds packed costs one
``iovec``, not one per sample.

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

import operator
from collections.abc import Iterable
from itertools import compress

import numpy as np

from rlwire._core.copying import concatenated
from rlwire._core.errors import ConfigError
from rlwire._core.slicing import Sliced, run_sliced

__all__ = ["Pieces"]

_NBYTES = operator.attrgetter("nbytes")


class Pieces:
    """The runs of one buffer, in order: flat, C-contiguous byte views (format ``B``),
    empty runs dropped, runs that lie back to back in one block merged into one view of
    it. They are not copied; their memory must stay unchanged until the message is sent,
    as for any buffer of a Frame.

    A codec puts a Pieces where a buffer goes in :attr:`rlwire.Frame.buffers`; the buffer
    is stored, hashed and compressed exactly as its joined bytes would be, and starts
    aligned as any buffer does (the runs after the first are not aligned: each starts
    where the one before ends). It may be a sidecar buffer. The receiver gets one
    contiguous memoryview.

    Attributes:
        runs: the non-empty runs, adjacent ones merged.
        nbytes: their total length, the buffer's length.

    Raises:
        ConfigError: a run is not a flat, C-contiguous byte view (cast arrays' views
            with ``memoryview(array).cast("B")``); a ``ValueError`` too.

    Example:
        >>> import numpy as np
        >>> tokens = np.arange(6, dtype=np.int32)
        >>> rows = [memoryview(tokens[0:2]).cast("B"), memoryview(tokens[2:6]).cast("B")]
        >>> pieces = Pieces([*rows, memoryview(b"more")])
        >>> pieces.nbytes, len(pieces.runs)  # the rows of one array became one run
        (28, 2)
    """

    __slots__ = ("nbytes", "runs")

    def __init__(self, runs: Iterable[memoryview]) -> None:
        kept: list[memoryview] = []
        taken: list[memoryview] = []  # runs after the first of the open stretch
        stretch = _Stretch()
        for run in runs:
            if run.ndim != 1 or run.format != "B" or not run.c_contiguous:
                raise ConfigError(
                    f"a run of Pieces must be a flat, contiguous byte view, got format "
                    f"{run.format!r}, {run.ndim} dimension(s), contiguous: {run.c_contiguous}"
                )
            if not run.nbytes:
                continue
            root = _root(run)
            if root is None or root is not stretch.root:  # another block: the common case
                if taken:
                    stretch.close(kept, taken)
                kept.append(run)
                stretch.root, stretch.begin, stretch.end = root, -1, -1
            elif stretch.extend(run, kept[-1]):
                taken.append(run)
            else:
                stretch.close(kept, taken)
                kept.append(run)
                stretch.start(run, root)
        stretch.close(kept, taken)
        self.runs: tuple[memoryview, ...] = tuple(kept)
        self.nbytes: int = sum(run.nbytes for run in kept)

    @classmethod
    def from_distinct(cls, runs: Iterable[memoryview]) -> Pieces:
        """Pieces of flat, C-contiguous byte views of distinct blocks (arrays that own
        their memory, say): the same as ``Pieces(runs)``, with no adjacent runs to look
        for, so no per-run lookups (what a column of thousands of rows would spend).

        Example:
            >>> rows = [np.arange(3, dtype=np.uint8), np.arange(2, dtype=np.uint8)]
            >>> Pieces.from_distinct(memoryview(r) for r in rows).nbytes
            5
        """
        pieces = cls.__new__(cls)
        given = list(runs)
        sizes = list(map(_NBYTES, given))  # in C: a column has thousands of runs
        pieces.runs = tuple(compress(given, sizes))
        pieces.nbytes = sum(sizes)
        return pieces

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


class _Stretch:
    """Consecutive runs that lie back to back in one block, about to become one run.

    Addresses are looked up only when a run's block is the previous run's (an identity
    test): independent arrays, the common case, cost no more than that.
    """

    __slots__ = ("address", "begin", "end", "root")

    def __init__(self) -> None:
        self.root: object = None
        self.begin = self.end = -1  # the stretch's addresses, looked up when first needed
        self.address = -1  # the address of the run extend() last refused

    def start(self, run: memoryview, root: object) -> None:
        """Open a stretch at ``run``, of block ``root``, that :meth:`extend` refused."""
        self.root = root
        self.begin = self.address
        self.end = self.address + run.nbytes if self.address >= 0 else -1

    def extend(self, run: memoryview, first: memoryview) -> bool:
        """Take ``run``, of the stretch's block, into the stretch whose first run is
        ``first`` if it starts where the stretch ends."""
        if self.end < 0:
            self.begin = _address(first)
            self.end = self.begin + first.nbytes
        self.address = _address(run)
        if self.address != self.end:
            return False
        self.end += run.nbytes
        return True

    def close(self, kept: list[memoryview], taken: list[memoryview]) -> None:
        """End the stretch: its first run, the last of ``kept``, becomes one view over
        the block of all its runs; or, if the block does not export its bytes as one
        block, the runs ``taken`` into the stretch after the first follow it in ``kept``."""
        if taken:
            merged = _span(self.root, self.begin, self.end)
            if merged is not None:
                kept[-1] = merged
            else:
                kept += taken
            taken.clear()
        self.root = None


def _root(run: memoryview) -> object:
    """The object that owns ``run``'s memory, through numpy views and memoryviews to
    their base (``None`` for a view that names no owner)."""
    obj: object = run.obj
    while True:
        if isinstance(obj, np.ndarray) and obj.base is not None:
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        else:
            return obj


def _address(view: memoryview) -> int:
    """Where ``view``'s bytes start in memory."""
    address: int = np.frombuffer(view, np.uint8).ctypes.data
    return address


def _span(root: object, begin: int, end: int) -> memoryview | None:
    """A read-only byte view of ``root``'s memory from address ``begin`` to ``end``, or
    None when ``root`` does not export it as one contiguous block holding that range."""
    try:
        block = memoryview(root).cast("B")  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):
        return None
    base = _address(block) if block.nbytes else 0
    if not base <= begin <= end <= base + block.nbytes:
        return None
    return block[begin - base : end - base].toreadonly()
