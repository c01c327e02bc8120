"""The keys of the parts a receiver's ``parts()`` handed out of a step, checked against
the step's seal: a part's key is what its store or its message says (a ZeroMQ part's
head, which no checksum covers), and a part whose key its seal contradicts is a
corrupt or forged step, refused as ``receive()`` refuses it, never handed out as is nor
ended at the seal as if all were well. Before the seal is there a part's key cannot be
checked; at the seal, the parts handed out before it are, those a receiver handed out
before it was resumed part way through the step too (their keys read again from the
source, or, where it cannot tell them, their count)."""

from __future__ import annotations

from collections.abc import Callable

from rlwire._core.errors import CorruptFrameError
from rlwire.transport._parts import Key, Seal

__all__ = ["HandedKeys"]

_UNKNOWN = object()  # the key of a part handed out before a resume, not read again


class HandedKeys:
    """The keys of the parts handed out of one step, by index (a receiver's, from the
    first part it handed out of the step; one resumed part way through is told of the
    parts before the marked one by :meth:`resumed`, and reads their keys at the seal).

    Example:
        >>> handed = HandedKeys()
        >>> handed.note(3, 0, "a")
        >>> seal = Seal(step=3, keys=(("a", "b"),), costs=((1.0, 1.0),))
        >>> def where(step: int, index: int) -> str:
        ...     return f"run/step-{step}.part-{index}"
        >>> handed.refused(seal, 0, where, extra=(1, "b")) is None
        True
        >>> str(handed.refused(seal, 0, where, extra=(1, "c")))
        "run/step-3.part-1: part 1 of rank 0 of step 3 holds key 'c'; the seal lists key 'b' for it"
    """

    def __init__(self) -> None:
        self._step = -1
        self._keys: dict[int, Key | object] = {}
        self._before = 0  # parts of _step handed out before a resume, keys not read yet

    def resumed(self, step: int, parts: int) -> None:
        """Parts ``0`` to ``parts - 1`` of ``step`` were handed out before the receiver
        was resumed (``resume=True``) at part ``parts``: checked at the seal too."""
        self._step, self._keys, self._before = step, {}, parts

    def note(self, step: int, index: int, key: Key) -> None:
        """Part ``index`` of ``step``, of key ``key``, is handed out."""
        if step != self._step:
            self._step, self._keys, self._before = step, {}, 0
        self._keys[index] = key

    def refused(
        self,
        seal: Seal,
        rank: int,
        where: Callable[[int, int], str],
        extra: tuple[int, Key] | None = None,
        key_of: Callable[[int, int], Key | None] | None = None,
    ) -> CorruptFrameError | None:
        """The error for the first part handed out of ``seal``'s step (and ``extra``,
        a part about to be: its index and key) whose key ``seal`` contradicts for
        ``rank``: another key at its index, or an index past the parts it lists;
        ``None`` if it contradicts none. ``where(step, index)`` names the part (a
        source's ``describe_part``). The keys of the parts handed out before a resume
        are read once, by ``key_of(step, index)`` (``None``: it cannot tell; then
        only that the seal lists the part is checked)."""
        if self._step == seal.step and self._before:
            for index in range(self._before):
                found = key_of(seal.step, index) if key_of is not None else None
                self._keys.setdefault(index, _UNKNOWN if found is None else found)
            self._before = 0
        handed = dict(self._keys) if self._step == seal.step else {}
        if extra is not None:
            handed[extra[0]] = extra[1]
        listed = seal.keys[rank] if rank < seal.ranks else ()
        for index, key in sorted(handed.items()):
            if index >= len(listed):
                n = len(listed)
                lists = f"lists {n} part{'' if n == 1 else 's'} for the rank"
            elif key is _UNKNOWN:
                continue
            elif listed[index] != key or type(listed[index]) is not type(key):
                lists = f"lists key {listed[index]!r} for it"
            else:
                continue
            holds = "was handed out before a resume" if key is _UNKNOWN else f"holds key {key!r}"
            return CorruptFrameError(
                f"part {index} of rank {rank} of step {seal.step} {holds}; the seal {lists}",
                where=where(seal.step, index),
                step=seal.step,
                rank=rank,
            )
        return None
