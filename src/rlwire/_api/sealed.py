"""A step filled part by part and sealed, read whole for a receive: its seal and the
rank's parts, all of one run of the step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlwire._core.errors import CorruptFrameError, FieldNotFoundError
from rlwire._frame.frame import Frame
from rlwire.transport._base import Source
from rlwire.transport._parts import PartInfo, Seal

__all__ = [
    "SealedStep",
    "follows",
    "mixed_runs",
    "read_handed_part",
    "read_part",
    "read_sealed",
    "run_of",
    "still_first",
    "where_of",
]


@dataclass(frozen=True)
class SealedStep:
    """A sealed step's parts for one rank, read and not yet decoded."""

    seal: Seal
    parts: list[tuple[PartInfo, Frame]]

    @property
    def nbytes(self) -> int:
        """The bytes of the parts' frames."""
        return sum(frame.nbytes for _, frame in self.parts)

    @property
    def message_id(self) -> bytes:
        """Its first part's :attr:`~rlwire.Frame.message_id`, what fields appended to
        the step are tied to (``b""``: no part for the rank)."""
        return self.parts[0][1].message_id if self.parts else b""


def read_sealed(source: Source, step: int, rank: int) -> tuple[int, SealedStep] | None:
    """``step`` of ``source`` for ``rank`` if it was filled part by part and is sealed:
    its seal and every part it lists for the rank, in order; else ``None``. The step
    returned is the one the source goes on with (:meth:`~rlwire.abc.Source.moved_to`:
    after a gap a socket said, past the steps it said never come).

    Also ``None`` when the step is being deleted and sent again meanwhile (a producer
    restarted with ``overwrite``): its seal went or changed, or a part follows another
    part 0 than the one read (:attr:`~rlwire.transport._parts.PartInfo.of`). The seal is
    read again after the parts: the parts may all be of a run sent after the seal read
    first, which lists other parts. The caller reads the step again, as it would a step
    not there yet; never parts of two runs, nor a run's parts under another's seal.

    Raises:
        CorruptFrameError: a part the seal lists is missing or is not the one listed;
            or it follows another part 0 than the rank's, which is still the one read
            (no run sent since: the store mixes runs, :func:`mixed_runs`).
    """
    step = source.moved_to(step)
    seal = source.read_seal(step)
    if seal is None:
        return None
    keys = seal.keys[rank] if rank < seal.ranks else ()
    parts: list[tuple[PartInfo, Frame]] = []
    for index, key in enumerate(keys):
        got = read_part(source, step, index)
        if got is not None and index and not follows(got[0], run_of(*parts[0])):
            if source.read_seal(step) != seal or not still_first(source, step, parts[0]):
                return None  # deleted and sent again since part 0 was read
            raise mixed_runs(source, step, rank, index)
        if got is None or got[0].key != key:
            if source.read_seal(step) != seal:
                return None  # deleted (and maybe sealed again) since the seal was read
            found = "is missing" if got is None else f"holds key {got[0].key!r}"
            raise CorruptFrameError(
                f"part {index} of rank {rank} of step {step} {found}; the seal lists key "
                f"{key!r} for it",
                where=source.describe_part(step, index),
                step=step,
                rank=rank,
            )
        parts.append(got)
    if parts and source.read_seal(step) != seal:
        return None  # the parts are of a run sent since the seal was read
    return step, SealedStep(seal, parts)


def read_part(source: Source, step: int, index: int) -> tuple[PartInfo, Frame] | None:
    """``source.read_part``, read once more when it fails as corrupt: the step deleted
    and written again (a producer restarted with ``overwrite``) between the reads of a
    part's main file and its sidecar leaves a main file of one run beside the sidecar
    of another, or none; read again, the part is one run's, or missing. A part that
    fails twice is corrupt.

    Raises:
        CorruptFrameError: the part failed twice (the first error).
    """
    try:
        return source.read_part(step, index)
    except CorruptFrameError as exc:
        first = exc
    try:
        return source.read_part(step, index)
    except CorruptFrameError:
        raise first from None


def run_of(info: PartInfo, frame: Frame) -> bytes:
    """What the parts after part 0 (``info``, ``frame``) name as the part 0 they follow:
    its id, or the run part 0 names itself (``ray://``)."""
    return info.of or frame.message_id


def follows(info: PartInfo, first: bytes) -> bool:
    """False if the part ``info`` says it follows another part 0 than ``first``'s."""
    return info.of is None or not first or info.of == first


def where_of(source: Source, step: int, read: Any) -> str:
    """Where an error decoding ``step`` as ``read`` (a frame, a :class:`SealedStep`, or
    either with fields appended: its ``inner``) says it is: ``source.describe(step)``
    (its main file), or, for a step filled part by part, which has none, its first part
    read, and how many parts followed."""
    inner = getattr(read, "inner", read)
    if not isinstance(inner, SealedStep) or not inner.parts:
        return source.describe(step)
    where = source.describe_part(step, inner.parts[0][0].index)
    more = len(inner.parts) - 1
    return f"{where} (and {more} more part{'s' if more > 1 else ''})" if more else where


def still_first(source: Source, step: int, first: tuple[PartInfo, Frame]) -> bool:
    """Whether the rank's part 0 of ``step`` stored now is still ``first`` (one read
    before); False when the source cannot tell."""
    return source.first_part(step) == run_of(*first)


def mixed_runs(source: Source, step: int, rank: int, index: int) -> CorruptFrameError:
    """The error for part ``index`` of ``step`` following another part 0 than the rank's
    part 0 while that part 0 is still stored. A step sent again (another run) replaces
    part 0 before it writes a later part naming the new part 0, so this is no step
    being sent again: the store mixes runs (a file copied from another run's
    directory, a forged one), and reading the step again finds the same."""
    return CorruptFrameError(
        f"part {index} of rank {rank} of step {step} follows another part 0 (of another "
        "run of the step) than the rank's part 0 stored beside it: the step mixes the "
        "parts of two runs, and no run was sent since (its part 0 is still the one read)",
        where=source.describe_part(step, index),
        step=step,
        rank=rank,
    )


def read_handed_part(source: Source, step: int, index: int) -> tuple[PartInfo, Frame] | None:
    """:func:`read_part` for ``parts()``, whose ``fields=`` are
    looked for in the part alone: a field missing there is said to be so, and why a
    field appended to the step is."""
    try:
        return read_part(source, step, index)
    except FieldNotFoundError as exc:
        said = exc.message.replace("not in the step (its", "not in the part (its")
        raise FieldNotFoundError(
            f"{said}; parts() hands out each part as it was committed, without the fields "
            "appended to its step since: receive() reads the step with them",
            where=exc.where,
            step=exc.step,
            rank=exc.rank,
        ) from None
