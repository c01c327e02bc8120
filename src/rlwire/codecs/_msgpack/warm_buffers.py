"""Memory a codec keeps for the small rows it joins (:mod:`rlwire.codecs._msgpack.joined_rows`),
used again for the next message once nothing holds the last one's.

Rows joined as new ``bytes`` each message rely on malloc to hand back the pages the
message before freed. glibc does so or not by heuristics of its own: sending a step of
8,000 small samples to two ranks took 45-60 ms where one rank or four took 30-34, as
glibc unmapped or trimmed the groups each time and the next step faulted every page in
again. Groups written into buffers kept here stay in memory that is already faulted in.

A buffer is written again only when no view of what it held is left: each is an
:class:`io.BytesIO`, which refuses any write while a view it exported lives (a numpy array
over it, a frame's buffer, a ZeroMQ message not yet sent, a copy into Ray's store under
way), so a message still held anywhere is never changed. The buffers are handed between
threads without a lock (``deque`` appends and pops are atomic), so a process forked while
another thread joins rows inherits no lock to wait on.
"""

from __future__ import annotations

import collections
import io
from collections.abc import Sequence
from typing import Any

__all__ = ["WarmBuffers"]

# The most buffers kept (about 512 KiB each, the groups of joined_rows): 64 MiB, some two
# steps of 8,000 small samples in flight. Beyond it a group is new bytes, as before.
_MOST = 128
# How many of the oldest buffers a join looks at before it takes a new one: each look
# costs a microsecond, and buffers still held (a receiver in this process keeping its
# steps) should not cost every join a scan of all of them.
_LOOKS = 4


class WarmBuffers:
    """Buffers that hold the groups of joined rows, each written again once no view of
    it is left.

    Example:
        >>> import numpy as np
        >>> warm = WarmBuffers()
        >>> first = warm.join([np.arange(2, dtype=np.uint8), np.arange(3, dtype=np.uint8)])
        >>> bytes(first), first.readonly
        (b'\\x00\\x01\\x00\\x01\\x02', True)
        >>> del first  # the next join writes the same memory
        >>> bytes(warm.join([b"ab"])), len(warm)
        (b'ab', 1)
    """

    def __init__(self) -> None:
        # every buffer kept, the one written longest ago first
        self._kept: collections.deque[io.BytesIO] = collections.deque()

    def __len__(self) -> int:
        return len(self._kept)

    def join(self, rows: Sequence[Any]) -> memoryview:
        """``rows`` (objects exporting C-contiguous buffers) back to back, as a read-only
        view of a kept buffer (of new bytes when every kept one is still held and
        :data:`_MOST` are kept).

        Raises:
            TypeError, ValueError: a row exports no buffer, or not one C-contiguous run.
        """
        for _ in range(min(_LOOKS, len(self._kept))):
            try:
                buffer = self._kept.popleft()  # this thread's alone until appended again
            except IndexError:  # other threads took the rest
                break
            try:
                buffer.seek(0)
                buffer.write(b"")  # refused while a view of the buffer lives
            except BufferError:
                self._kept.append(buffer)
                continue
            return self._filled(buffer, rows)
        if len(self._kept) >= _MOST:
            # ndarrays export their buffer, which numpy's stubs do not say
            return memoryview(b"".join(rows))
        return self._filled(io.BytesIO(), rows)

    def _filled(self, buffer: io.BytesIO, rows: Sequence[Any]) -> memoryview:
        try:
            buffer.writelines(rows)
            # (the view ends at the rows: the buffer may hold more, from an earlier join)
            return buffer.getbuffer()[: buffer.tell()].toreadonly()
        finally:
            self._kept.append(buffer)
