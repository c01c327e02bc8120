"""Which receivers a ZeroMQ sender serves: the two patterns, why a receiver that
announced itself is refused (a ``refuse`` packet tells it, and it gets nothing), and the
error the receiver raises for it."""

from __future__ import annotations

from typing import Literal

from rlwire._core.errors import ConfigError
from rlwire.transport.zmq._control import Ready

__all__ = ["NO_PARTS", "Pattern", "misfit", "refusal"]

#: ``"ranks"``: each rank's payload goes to that rank's receiver; ``"shared"``: each step
#: goes to one of the consumers.
Pattern = Literal["ranks", "shared"]

NO_PARTS = (
    "this receiver speaks ZeroMQ protocol 2.0, which cannot read a step filled part by "
    "part (open_step); the sender sends such steps: upgrade rlwire (protocol 2.1)"
)


def misfit(ready: Ready, pattern: Pattern, *, parts: bool) -> str:
    """Why a receiver that announced ``ready`` cannot be served by a sender of
    ``pattern`` (which sends steps filled part by part if ``parts``), or ``""``: it
    expects the other pattern, cannot read parts, or (naming no pattern) asks a
    ``shared`` sender for a rank other than 0, which only the ``ranks`` pattern deals out.
    """
    if ready.pattern is not None and ready.pattern != pattern:
        return (
            f"this receiver expects the {ready.pattern!r} pattern, but the sender "
            f"uses the {pattern!r} pattern (storage option 'pattern')"
        )
    if parts and ready.minor < 1:
        return NO_PARTS
    if pattern == "shared" and ready.pattern is None and ready.rank:
        return (
            f"this receiver asked for rank {ready.rank}, but the sender deals each "
            "step to one consumer (storage option pattern='shared'); open the sender "
            "with pattern='ranks' for per-rank payloads, or the consumers with rank 0"
        )
    return ""


def refusal(rank: int, why: str, *, where: str) -> ConfigError:
    """What a receiver of ``rank`` raises once a sender refused it, for ``why`` (the text
    of the ``refuse`` packet): on that read and every later one, as the sender will send
    it nothing.

    Example:
        >>> str(refusal(1, "it expects the other pattern", where="ipc:///run"))
        'ipc:///run: the sender refused this receiver of rank 1: it expects the other pattern'
    """
    return ConfigError(
        f"the sender refused this receiver of rank {rank}: {why}", where=where, rank=rank
    )
