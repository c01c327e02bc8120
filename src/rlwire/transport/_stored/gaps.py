"""Why a rank's message of a step is missing, from the destination's listing: not sent
yet (a receiver waits), or never to come (a receiver raises
:class:`~rlwire.StepGapError` instead of waiting for ever)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rlwire.transport._stored.names import MAIN_RE, SEAL_RE, STEP_PART_RE

__all__ = ["deleted", "fewer", "never_coming"]


def never_coming(
    names: Iterable[str],
    step: int,
    rank: int,
    end: int | None,
    sent_to: Callable[[], int | None] | None = None,
) -> str | None:
    """Why ``rank``'s message of ``step`` will never be stored, or ``None`` if it may
    still come (a receiver waits for it). ``names`` lists the destination, read after
    the miss; ``end``: the step the end mark gives (``None``: no mark), read before
    ``names``; ``sent_to()``: how many ranks the envelope of rank 0's main file of
    ``step`` records (``None``: written before 1.8, or unreadable), asked only when that
    file is listed and nothing after ``step`` is.

    A step is committed whole (every rank's main file) before the next one is sent and
    before the end is marked. So once a later step is listed, or the end is marked after
    ``step``, a main file of ``step`` that is not listed never will be: its commit was
    cut short (a producer killed after rank 0's main file, resumed after the step: on S3
    without sidecars nothing of the other ranks is listed, so ``resume`` may take it for
    a step of fewer ranks), or it was sent to fewer ranks, or retention deleted it. A
    step filled part by part is not decided here: its seal says which parts each rank
    has.
    """
    mains: dict[int, set[int]] = {}
    stored: set[int] = set()
    for name in names:
        if m := MAIN_RE.fullmatch(name):
            mains.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
            stored.add(int(m.group(1)))
        elif (m := SEAL_RE.fullmatch(name)) or (m := STEP_PART_RE.fullmatch(name)):
            stored.add(int(m.group(1)))
    have = mains.get(step, set())
    if rank in have or step in stored - set(mains):
        return None  # arrived since the miss, or filled part by part: read it so
    later = sorted(s for s in stored if s > step)
    if not later and (end is None or end <= step):
        # Not sent yet, or being committed (rank 0's file is moved first), unless rank 0's
        # envelope says the step went to fewer ranks: then the left-out rank learns it
        # now, not once the next step is sent, which may be a whole rollout later.
        ranks = sent_to() if sent_to is not None and 0 in have else None
        return fewer(step, ranks, rank) if ranks is not None and ranks <= rank else None
    after = f"the stream ended at step {end}" if not later else f"step {later[0]} is stored"
    if 0 in have:  # a commit makes main files visible from rank 0 up
        return (
            f"step {step} was committed for ranks {sorted(have)} only, and {after}: it will "
            f"never have a message for rank {rank} (a sender killed while committing it, "
            f"then resumed after it; or a step sent to fewer ranks). To give every rank the "
            f"step, open the sender with start_step={step}, on_existing='truncate' and send "
            f"from step {step} again; or skip() it"
        )
    if later and (have or min(stored) > step):  # retention deletes rank 0's first
        return deleted(step, later[0])
    return (
        f"step {step} is missing, and {after}: it will never come; open the sender with "
        f"start_step={step}, on_existing='truncate' and send from step {step} again, or "
        f"skip() it"
    )


def deleted(step: int, oldest: int) -> str:
    """Why ``step``, deleted by retention, will never come; ``oldest``: the oldest
    stored step. Nothing tells whether it had a message for the receiver's rank."""
    return (
        f"step {step} is no longer stored: the sender's keep_last deleted it, before this "
        "receiver read it or, if it was not sent to this rank (a step sent to fewer "
        "ranks), once the ranks it was sent to moved past it; the oldest stored step is "
        f"{oldest}: skip() it, or open the receiver with start_step={oldest} to go on "
        "from there"
    )


def fewer(step: int, ranks: int, rank: int) -> str:
    """Why ``step``, sent to ``ranks`` ranks, will never have a message for ``rank``."""
    sent = "rank 0" if ranks == 1 else f"ranks 0..{ranks - 1}"
    return (
        f"step {step} was sent to {sent} only: it will never have a message for "
        f"rank {rank} (a step sent to fewer ranks: a send after a send_ranks, or a "
        "send_ranks of fewer objects); skip() it"
    )
