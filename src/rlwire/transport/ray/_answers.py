"""What the board answers a receiver, checked before it is used.

Any client of the Ray cluster can call a board's methods (``stage``, ``commit``,
``commit_part``, ``seal``, ...) with values of its own: the board keeps what it is
given, and a receiver must not take it on trust. A reference that is not an object
reference, checksums that are not bytes, a part's key or cost or a seal that a sender
could not have made are a :class:`~rlwire.errors.CorruptFrameError` naming the step,
never Ray's or Python's own error.
"""

from __future__ import annotations

from typing import Any

import msgspec
from ray import ObjectRef

from rlwire._core.errors import ConfigError, CorruptFrameError, TransportError
from rlwire.transport._parts import Key, PartInfo, Seal, check_key
from rlwire.transport._stored.parts import parse_seal, seal_bytes

__all__ = [
    "checked_commit",
    "checked_part",
    "checked_refs",
    "checked_seal",
    "commit_id",
    "missing_commit",
]


def checked_refs(
    main: Any, side: Any, checksums: Any, where: str
) -> tuple[ObjectRef[Any], ObjectRef[Any] | None, bytes | None]:
    """A message's references and checksums as the board gave them.

    Raises:
        CorruptFrameError: a reference that is not an object reference, or checksums
            that are not bytes.
    """
    if not isinstance(main, ObjectRef) or not (side is None or isinstance(side, ObjectRef)):
        raise CorruptFrameError(
            f"the board holds a {type(main).__name__} and a {type(side).__name__} for the "
            "message's objects, not object references (put there by another client?)",
            where=where,
        )
    if checksums is not None and type(checksums) is not bytes:
        raise CorruptFrameError(
            f"the board holds a {type(checksums).__name__} for the message's checksums, "
            "not bytes (put there by another client?)",
            where=where,
        )
    return main, side, checksums


def _key(key: Any, where: str) -> Key:
    try:
        return check_key(msgspec.convert(key, str | int))
    except (msgspec.ValidationError, ConfigError) as exc:
        raise CorruptFrameError(
            f"the board holds {key!r} for a part's key, which no sender puts", where=where
        ) from exc


def checked_part(rank: int, index: int, key: Any, cost: Any, where: str) -> PartInfo:
    """The :class:`PartInfo` of a part the board answered with ``key`` and ``cost``.

    Raises:
        CorruptFrameError: the key is not a part's key, or the cost is not a number.
    """
    try:
        weight = msgspec.convert(cost, float)
    except msgspec.ValidationError as exc:
        raise CorruptFrameError(
            f"the board holds {cost!r} for a part's cost, not a number", where=where
        ) from exc
    return PartInfo(rank=rank, index=index, key=_key(key, where), cost=weight)


def checked_seal(step: int, keys: Any, costs: Any, where: str) -> Seal:
    """The :class:`Seal` of ``step`` the board answered as ``keys`` and ``costs``,
    checked as a stored seal is (one cost per key, no key twice, none empty).

    Raises:
        CorruptFrameError: it is not a seal a sender could make.
    """
    try:
        keys = msgspec.convert(keys, list[list[str | int]])
        costs = msgspec.convert(costs, list[list[float]])
    except msgspec.ValidationError as exc:
        raise CorruptFrameError(f"the board answered a malformed seal: {exc}", where=where) from exc
    if len(keys) != len(costs) or any(len(k) != len(c) for k, c in zip(keys, costs, strict=True)):
        raise CorruptFrameError("the board answered a malformed seal", where=where)
    seal = Seal(
        step=step,
        keys=tuple(tuple(_key(k, where) for k in rank) for rank in keys),
        costs=tuple(tuple(rank) for rank in costs),
    )
    return parse_seal(seal_bytes(seal), step=step, where=where)  # its keys checked as stored


def commit_id(token: object) -> bytes:
    """The :attr:`~rlwire.Frame.message_id` of a step whose commit the board names
    ``token`` (``b""``: none named)."""
    return token.encode() if isinstance(token, str) else b""


def checked_commit(named: tuple[int, str] | None, step: int, token: object, where: str) -> None:
    """Raise unless the board's ``token`` of ``step`` is the commit a StepHandle
    ``named`` (its step and token), when it names one of ``step``.

    Raises:
        TransportError: the handle's step was deleted and sent again since.
    """
    if named is not None and named[0] == step and token != named[1]:
        raise TransportError(
            f"step {step} is not the one the StepHandle names: that one was deleted "
            "(an overwrite, a truncate, keep_last) and the step sent again since, by "
            "another run",
            where=where,
        )


def missing_commit(named: tuple[int, str] | None, step: int, where: str) -> None:
    """Raise if a StepHandle ``named`` ``step``, which a receiver is about to wait for.

    A handle is made once its step is committed: the board not holding the step now
    means it was deleted since, and no later commit of the step is the handle's, however
    long the receiver waits.

    Raises:
        TransportError: ``named`` names a commit of ``step``.
    """
    if named is not None and named[0] == step:
        raise TransportError(
            f"step {step} is not on the board: the commit the StepHandle names was deleted "
            "since (an overwrite, a truncate), and a step sent again would be another run's",
            where=where,
        )
