"""What a ZeroMQ sender says when it cannot reach its receivers: a receiver gone (or
replaced) midway through its message, one missing after ``ready_timeout``, one whose queue
stayed full for the end. Each names the ranks (or how many consumers); the sink adds its
endpoint as the error passes."""

from __future__ import annotations

from rlwire._core.errors import TransportError
from rlwire.transport.zmq._admission import Pattern

__all__ = ["gone", "timed_out", "untold"]


def gone(pattern: Pattern, rank: int, *, replaced: bool) -> TransportError:
    """The receiver of ``rank`` (a consumer, if ``shared``) being sent its message
    disconnected, or (``replaced``) lost its rank to a newer receiver of it; the message
    was given up before its seal.

    Example:
        >>> str(gone("ranks", 2, replaced=True))[:55]
        'another receiver of rank 2 took the rank over midway th'
    """
    if pattern == "shared":
        return TransportError("the consumer being sent this step disconnected")
    if replaced:
        return TransportError(
            f"another receiver of rank {rank} took the rank over midway through the "
            "message of this step, which was given up: the new receiver gets the step if "
            "it is sent again, else a StepGapError for it"
        )
    return TransportError(
        f"the receiver of rank {rank} disconnected; it will get a StepGapError for "
        "this step when it reconnects"
    )


def untold(
    pattern: Pattern, ranks: list[int], pending: int, *, end: int | None, seconds: float
) -> TransportError:
    """The end (step ``end``) could not be sent to the receivers of ``ranks`` (``pending``
    consumers, if ``shared``) within ``linger=seconds``: their queues stayed full."""
    if pattern == "ranks":
        names = ", ".join(map(str, ranks))
        whom = (
            f"the receivers of ranks {names}" if len(ranks) > 1 else f"the receiver of rank {names}"
        )
    else:
        whom = f"{pending} of the consumers"
    return TransportError(
        f"the end of the stream (step {end}) could not be sent to {whom}: its "
        f"queue stayed full (it read nothing) for linger={seconds} s; closing the "
        "sender tries again for as long"
    )


def timed_out(
    pattern: Pattern,
    ranks: list[int],
    *,
    live: int,
    consumers: int,
    ready_timeout: float | None,
    refused: str | None,
) -> TransportError:
    """No receiver of ``ranks`` (too few of ``consumers``: ``live``, if ``shared``)
    announced itself within ``ready_timeout``; ``refused``: why one was refused, if one
    was."""
    if pattern == "ranks":
        missing = f"no receiver of rank {', '.join(map(str, ranks))} announced itself"
    else:
        missing = f"{live} of {consumers} consumers announced themselves"
    why = f"; refused: {refused}" if refused else ""
    return TransportError(f"{missing} within ready_timeout={ready_timeout} s{why}")
