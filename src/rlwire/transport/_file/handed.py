"""The mappings a file source handed out, unmapped once unused, in the reading thread."""

from __future__ import annotations

import errno
import mmap
import threading
import time
from collections.abc import Callable

__all__ = ["FEW", "WAIT_FACTOR", "HandedMappings"]

#: Up to this many mappings in use, every one is tried at each read (it costs nothing).
FEW = 16
#: A reader that waits tries every mapping again once this many times as long as its last
#: try of them all took has passed (at most a twentieth of the time, in tries).
WAIT_FACTOR = 20
#: What mapping a file raises when the process is out of descriptors or of mappings.
_CROWDED = {errno.EMFILE, errno.ENFILE, errno.ENOMEM}


class HandedMappings:
    """The mappings a source handed out, each unmapped once no view of it is left: in
    the thread that reads the next file (:meth:`unmap_due`), not wherever the last
    array over it is dropped. Unmapping a step of 1.6 GB takes ~0.15 s; in a trainer's
    event-loop thread (``batch = await receiver.areceive()`` drops the previous batch)
    that is a 0.15 s stall.

    Trying to unmap a mapping still in use costs a raised ``BufferError``. Trying every
    mapping held before each file read made reading N files held at once (a step filled
    part by part, received whole) take N²/2 tries: 16,000 parts, 230 s. At each read,
    :meth:`unmap_due` tries the mappings handed out since the last read (a part dropped
    as the next is read goes at once), and all of them when

    - at most :data:`FEW` were in use after the last try of them all;
    - as many reads have passed since that try as mappings were in use after it, so
      that a read pays for about two tries (reading N files is linear in N);
    - nothing was handed out since the last read (a reader waiting for a step), and
      :data:`WAIT_FACTOR` times as long as that try took has passed since it ended: a
      step dropped while its reader waits goes within that (16,000 parts: ~0.6 s).

    A mapping no longer in use is thus unmapped at the next read while few are held,
    else within as many reads as were held at the last try of them all.

    Example:
        >>> handed = HandedMappings()
        >>> handed.append(mmap.mmap(-1, mmap.PAGESIZE))
        >>> handed.unmap_due()
        >>> len(handed)
        0
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._held: list[mmap.mmap] = []  # in use when last tried
        self._new: list[mmap.mmap] = []  # handed out since the last read, not tried yet
        self._kept = 0  # how many were in use after the last try of them all
        self._reads = 0  # reads since it
        self._ended = 0.0  # when it ended (``clock``)
        self._took = 0.0  # how long it took
        self._clock = clock
        self._lock = threading.Lock()

    def append(self, mapping: mmap.mmap) -> None:
        """Hold ``mapping``, handed out, until nothing uses it."""
        with self._lock:
            self._new.append(mapping)

    def clear(self) -> None:
        """Let go of every mapping held (each unmaps itself when it is collected)."""
        with self._lock:
            self._held.clear()
            self._new.clear()
            self._kept = self._reads = 0

    def unmap_unused(self) -> None:
        """Unmap every mapping held that nothing uses."""
        with self._lock:
            self._try_all()

    def unmap_due(self) -> None:
        """Unmap, before a read, the mappings nothing uses that are due a try (see the
        class docstring)."""
        with self._lock:
            self._reads += 1
            if (
                self._kept <= FEW
                or self._reads >= self._kept
                or (not self._new and self._clock() - self._ended >= WAIT_FACTOR * self._took)
            ):
                self._try_all()
            else:
                self._held += _in_use(self._new)
                self._new = []

    def crowding(self, exc: OSError) -> str:
        """What to say of the mappings held when mapping a file failed with ``exc``, if
        they may be why: each holds a descriptor (CPython's mmap keeps a copy of its
        file's) and counts against ``vm.max_map_count``; else ``""``."""
        held = len(self)
        if exc.errno not in _CROWDED or held <= FEW:
            return ""
        return (
            f" beside the {held} files this receiver has mapped (each file whose arrays"
            " are in use, as every part of a step received whole, holds a descriptor:"
            " raise the open-file limit, ulimit -n, or vm.max_map_count, or read the"
            " step with parts())"
        )

    def _try_all(self) -> None:
        began = self._clock()
        self._held = _in_use(self._held + self._new)
        self._new = []
        self._kept, self._reads = len(self._held), 0
        self._ended = self._clock()
        self._took = self._ended - began

    def __len__(self) -> int:
        with self._lock:
            return len(self._held) + len(self._new)


def _in_use(mappings: list[mmap.mmap]) -> list[mmap.mmap]:
    """Unmap each of ``mappings`` nothing uses; those still in use."""
    in_use = []
    for mapping in mappings:
        try:
            mapping.close()  # munmap, with the GIL released
        except BufferError:  # arrays or views over it are still alive
            in_use.append(mapping)
    return in_use
