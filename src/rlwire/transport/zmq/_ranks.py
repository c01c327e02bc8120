"""Which receiver serves each rank of a ``ranks`` sender, and which receivers lost their
rank to a newer one (docs/format.md, "ZeroMQ messages").

The newest receiver of a rank wins: the one whose ``ready`` the sender read last, among
receivers it had not replaced before. A restarted trainer gets in that way even while
its old process lives on (hung: its connection stays up, and ZeroMQ's I/O thread keeps
answering for it, so no liveness check could tell it from a live trainer); a second
trainer of the same rank takes it over too. Either way the replaced receiver is refused
for as long as the sender lives (a ``refuse`` packet, which it raises as ``ConfigError``),
on the spot and whenever it announces itself again: it never takes the rank back, and
never waits without being told. So each step of a rank goes to one receiver, and each
receiver gets the rank's steps in order, up to its replacement.

A receiver is known by its routing id (random, one per receiver, kept across
reconnections): a receiver back after a network blip keeps its rank, and a restarted one
is a new receiver.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

__all__ = ["RankOwners", "taken_over"]


def taken_over(rank: int) -> str:
    """Why a receiver of ``rank`` that a newer one replaced is refused: the text of its
    ``refuse`` packet.

    Example:
        >>> taken_over(3)[:60]
        'another receiver of rank 3 announced itself after this one: '
    """
    return (
        f"another receiver of rank {rank} announced itself after this one: the newest "
        f"receiver of a rank gets its steps, and this one gets no more (two trainers "
        f"were started with rank {rank}, or this one was restarted while this process "
        "lived on)"
    )


@dataclass(eq=False)
class RankOwners:
    """Each rank's receiver (by routing id), and the receivers replaced by a newer one of
    their rank."""

    # rank -> routing id of its receiver
    _owner: dict[int, bytes] = field(default_factory=dict)
    # routing id -> the rank a newer receiver took from it, until its bye
    _replaced: dict[bytes, int] = field(default_factory=dict)

    def owner(self, rank: int) -> bytes | None:
        """The routing id of ``rank``'s receiver, if one is there."""
        return self._owner.get(rank)

    def ranks(self) -> Collection[int]:
        """The ranks that have a receiver."""
        return self._owner.keys()

    def served(self) -> list[tuple[int, bytes]]:
        """Each rank that has a receiver, with its routing id."""
        return list(self._owner.items())

    def ranks_of(self, peers: Collection[bytes]) -> list[int]:
        """The ranks served by ``peers``, in order."""
        return sorted(rank for rank, peer in self._owner.items() if peer in peers)

    def replaced(self, peer: bytes) -> int | None:
        """The rank a newer receiver took from ``peer``, or ``None``."""
        return self._replaced.get(peer)

    def take(self, rank: int, peer: bytes) -> bytes | None:
        """``peer`` (not replaced) now serves ``rank``; the receiver it replaces, if
        another one served it, which is refused from now on."""
        old = self._owner.get(rank)
        self._owner[rank] = peer
        if old is None or old == peer:
            return None
        self._replaced[old] = rank
        return old

    def release(self, peer: bytes) -> None:
        """``peer`` serves no rank until it announces itself again (it vanished)."""
        for rank, known in list(self._owner.items()):
            if known == peer:
                del self._owner[rank]

    def drop(self, peer: bytes) -> None:
        """Forget ``peer`` for good: it said bye, and its routing id is never reused."""
        self.release(peer)
        self._replaced.pop(peer, None)
