"""Names of stored messages (files or objects) and where a sender starts among them.

Shared by every sink that stores one message per step and rank under a directory or key
prefix: ``step-00000007.rank-0000.rlw`` holds the main file, ``….sidecar.rlw`` the
sidecar file, and ``.<name>.<random hex>.tmp`` a file being written. A step filled part
by part has no main file: part 3 of rank 1 is ``step-00000007.rank-0001.part-000003.rlw``
(and ``….part-000003.sidecar.rlw``), and ``step-00000007.seal.rlw`` closes the step.
A file sink that recycles keeps the files of a pruned step as
``.pool.rank-0000.rlw.<random hex>.tmp`` (``.pool.rank-0000.sidecar.rlw…`` for a
sidecar) until a new step is written into them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from rlwire._core.atomic import temp_name
from rlwire._core.errors import ConfigError, StepExistsError
from rlwire.transport._base import OnExisting

__all__ = [
    "CONSUMED_PART_RE",
    "CONSUMED_RE",
    "END_NAME",
    "FIELDS_RE",
    "FILE_RE",
    "LEFTOVER_RE",
    "MAIN_RE",
    "POOL_RE",
    "RANK_FILE_RE",
    "REWRITE_NAME",
    "SEAL_RE",
    "STEP_PART_RE",
    "STORED_RE",
    "TEMP_RE",
    "consumed_name",
    "consumed_part_name",
    "fields_name",
    "main_name",
    "names_to_delete",
    "never_replaced",
    "part_name",
    "part_sidecar_name",
    "pool_name",
    "seal_name",
    "sidecar_name",
    "start_step",
    "temp_name",
]

#: The end-of-stream mark a finished sender leaves (see :func:`~rlwire.transport.layout.end_mark`).
END_NAME = "end.rlw"
#: The mark of an ``on_existing="overwrite"`` or ``"truncate"`` under way: written
#: (whole) before its first deletion and removed after its last, so that a sender killed
#: in between leaves it, and ``"resume"`` refuses to continue after the old run's steps.
REWRITE_NAME = "rewrite.rlw"
#: A rank's consumption mark; group: rank.
CONSUMED_RE = re.compile(r"consumed\.rank-(\d+)\.rlw")
#: A rank's part mark (how far into a step filled part by part); group: rank.
CONSUMED_PART_RE = re.compile(r"consumed\.rank-(\d+)\.part\.rlw")
#: A main file; groups: step, rank.
MAIN_RE = re.compile(r"step-(\d+)\.rank-(\d+)\.rlw")
#: A main or sidecar file; groups: step, rank, sidecar suffix.
STORED_RE = re.compile(r"step-(\d+)\.rank-(\d+)(\.sidecar)?\.rlw")
#: A part of a step filled part by part, main or sidecar file; groups: step, rank,
#: index, sidecar suffix.
STEP_PART_RE = re.compile(r"step-(\d+)\.rank-(\d+)\.part-(\d+)(\.sidecar)?\.rlw")
#: Fields appended to a committed step (``add_fields``), main or sidecar file; groups:
#: step, rank, index, sidecar suffix.
FIELDS_RE = re.compile(r"step-(\d+)\.rank-(\d+)\.fields-(\d+)(\.sidecar)?\.rlw")
#: The seal of a step filled part by part; group: step.
#: A step's file of one rank (whole message, part or appended fields); groups: step, rank.
RANK_FILE_RE = re.compile(r"step-(\d+)\.rank-(\d+)(?:\.(?:part|fields)-\d+)?(?:\.sidecar)?\.rlw")
SEAL_RE = re.compile(r"step-(\d+)\.seal\.rlw")
#: A file still being written (or left behind by a sender that was killed).
TEMP_RE = re.compile(
    r"\.step-\d+\.(?:rank-\d+(?:\.(?:part|fields)-\d+)?(\.sidecar)?|seal)\.rlw\.[0-9a-f]+\.tmp"
)
#: A pruned step's file kept for reuse by a file sink that recycles; groups: rank,
#: sidecar suffix.
POOL_RE = re.compile(r"\.pool\.rank-(\d+)(\.sidecar)?\.rlw\.[0-9a-f]+\.tmp")
#: A temporary file any writer may leave when killed: a step's file, a mark
#: (consumption, part, end, rewrite, fence), the sink's probe of the directory, or a pooled file.
LEFTOVER_RE = re.compile(
    r"\.(?:step-\d+\.(?:rank-\d+(?:\.(?:part|fields)-\d+)?(?:\.sidecar)?|seal)"
    r"|consumed\.rank-\d+(?:\.part)?|end|rewrite|fence)"
    r"\.rlw\.[0-9a-f]+\.tmp"
    r"|\.rlwire-probe\.\d+\.[0-9a-f]+\.tmp"
    rf"|{POOL_RE.pattern}"
)
#: Any file, stored or being written; groups: step, rank.
FILE_RE = re.compile(r"\.?step-(\d+)\.rank-(\d+)(?:\.sidecar)?\.rlw(?:\.[0-9a-f]+\.tmp)?")


def main_name(step: int, rank: int) -> str:
    """Name of the main file of ``step`` for ``rank``."""
    return f"step-{step:08d}.rank-{rank:04d}.rlw"


def sidecar_name(step: int, rank: int) -> str:
    """Name of the sidecar file of ``step`` for ``rank``."""
    return f"step-{step:08d}.rank-{rank:04d}.sidecar.rlw"


def part_name(step: int, rank: int, index: int) -> str:
    """Name of the main file of part ``index`` of ``rank`` in ``step``.

    Example:
        >>> part_name(7, 1, 3)
        'step-00000007.rank-0001.part-000003.rlw'
    """
    return f"step-{step:08d}.rank-{rank:04d}.part-{index:06d}.rlw"


def part_sidecar_name(step: int, rank: int, index: int) -> str:
    """Name of the sidecar file of part ``index`` of ``rank`` in ``step``."""
    return f"step-{step:08d}.rank-{rank:04d}.part-{index:06d}.sidecar.rlw"


def fields_name(step: int, rank: int, index: int, *, sidecar: bool = False) -> str:
    """Name of the ``index``-th file of fields appended to ``step`` for ``rank``.

    Example:
        >>> fields_name(7, 1, 0)
        'step-00000007.rank-0001.fields-000.rlw'
    """
    return f"step-{step:08d}.rank-{rank:04d}.fields-{index:03d}{'.sidecar' if sidecar else ''}.rlw"


def seal_name(step: int) -> str:
    """Name of the seal of ``step``, a step filled part by part."""
    return f"step-{step:08d}.seal.rlw"


def never_replaced(name: str) -> bool:
    """Whether the stored file ``name`` is one a commit must never replace: a step's
    files (whole message, part or appended fields, main or sidecar) and its seal. The
    marks (end, rewrite, consumption, part marks) are written again in place.

    Example:
        >>> never_replaced(seal_name(7)), never_replaced(consumed_name(0))
        (True, False)
    """
    return bool(RANK_FILE_RE.fullmatch(name) or SEAL_RE.fullmatch(name))


def pool_name(name: str) -> str:
    """A fresh name to keep the stored file ``name`` under in a file sink's pool: its
    step dropped, its rank and kind kept, hidden from readers like a temporary file.

    Example:
        >>> bool(POOL_RE.fullmatch(pool_name("step-00000007.rank-0001.sidecar.rlw")))
        True
    """
    return temp_name("pool" + name[name.index(".") :])


def consumed_name(rank: int) -> str:
    """Name of the mark where ``rank``'s receiver records the steps it moved past."""
    return f"consumed.rank-{rank:04d}.rlw"


def consumed_part_name(rank: int) -> str:
    """Name of the mark where ``rank``'s receiver records how far into a step filled
    part by part it got.

    Example:
        >>> consumed_part_name(3)
        'consumed.rank-0003.part.rlw'
    """
    return f"consumed.rank-{rank:04d}.part.rlw"


def _span(steps: list[int]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"steps {steps[0]}..{steps[-1]} ({len(steps)} steps)"


def _scan(names: Iterable[str]) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """The ranks of each step whose main file is visible, and those with any file at
    all (main, sidecar, or one still being written)."""
    mains: dict[int, set[int]] = {}
    any_file: dict[int, set[int]] = {}
    for name in names:
        m = MAIN_RE.fullmatch(name)
        if m:
            mains.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        m = FILE_RE.fullmatch(name)
        if m:
            any_file.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    return mains, any_file


def _scan_parts(names: Iterable[str]) -> tuple[set[int], set[int]]:
    """The steps filled part by part: those sealed, and those with a part's main file."""
    sealed: set[int] = set()
    parted: set[int] = set()
    for name in names:
        if m := SEAL_RE.fullmatch(name):
            sealed.add(int(m.group(1)))
        elif (m := STEP_PART_RE.fullmatch(name)) and not m.group(4):
            parted.add(int(m.group(1)))
    return sealed, parted


def start_step(
    where: str,
    names: Iterable[str],
    on_existing: OnExisting,
    first: int | None = None,
    sent_to: Callable[[int, int], int | None] | None = None,
    every: bool = False,
) -> int:
    """The first step a sender sends to a destination holding ``names``.

    ``first`` is the sender's ``start_step`` (``None``: not given). ``"error"`` refuses
    stored steps at or after ``first`` (any step when ``first`` is ``None``);
    ``"resume"`` refuses them too, and a stored sequence with a hole or an incomplete
    step, then continues at ``first`` or after the last stored step (at the last stored
    step itself when it was being filled part by part and is not sealed: the sender
    finishes it); ``"truncate"`` starts at ``first`` and ``"overwrite"`` at ``first`` or
    0. ``sent_to(step, rank)`` reads how many ranks a step sent whole was sent to from
    ``rank``'s message of it (None: not recorded), which tells a step of fewer ranks
    from an incomplete one; ``every``: ask it of every step, not only of each run's
    edges (:func:`_told`). The caller then deletes what :func:`names_to_delete` lists.
    An end-of-stream mark (:data:`END_NAME`) is refused by ``"error"``, deleted by the
    others.

    Raises:
        StepExistsError: the stored steps conflict with ``on_existing``; the message
            names the steps and ranks and how to repair the destination.
        ConfigError: ``"truncate"`` without ``first``.
    """
    if on_existing == "truncate" and first is None:
        raise ConfigError("on_existing='truncate' needs start_step (the step to send next)")
    if on_existing in ("overwrite", "truncate"):
        return first or 0
    names = list(names)
    mains, any_file = _scan(names)
    sealed, parted = _scan_parts(names)
    stored = set(mains) | sealed | parted
    last = max(stored, default=-1)
    unsealed = last in parted and last not in sealed and last not in mains
    # Resuming at the open step itself finishes it: it is no step of an earlier run.
    finish = on_existing == "resume" and unsealed and first == last
    later = sorted(s for s in stored if s >= (first or 0) and not (finish and s == last))
    if later and (on_existing == "error" or first is not None):
        after = "" if first is None else f" at or after start_step {first}"
        repair = (
            "open the sender with on_existing='overwrite' to delete them or "
            "on_existing='resume' to continue after them"
            if first is None
            else f"open the sender with start_step={first}, on_existing='truncate' to "
            f"delete them (a restart from a checkpoint), keeping the earlier steps"
        )
        raise StepExistsError(
            f"holds {_span(later)}{after} from an earlier run; {repair}", where=where
        )
    if on_existing == "error" and END_NAME in names:
        raise StepExistsError(
            f"holds the end-of-stream mark of a finished run ({END_NAME}); open the sender "
            "with on_existing='resume' to continue that stream, or 'overwrite'",
            where=where,
        )
    if on_existing == "error" or not stored:
        return first or 0
    _check_resumable(where, mains, any_file, first, sealed, parted, sent_to, every)
    if unsealed:
        if first is not None and first != last:
            raise StepExistsError(
                f"cannot resume at start_step {first}: step {last} was being filled part by "
                f"part and is not sealed; resume without start_step (or with start_step="
                f"{last}) to finish it, or open the sender with start_step={last}, "
                "on_existing='truncate' to delete it",
                where=where,
            )
        return last
    return first if first is not None else last + 1


def _check_resumable(
    where: str,
    mains: dict[int, set[int]],
    any_file: dict[int, set[int]],
    first: int | None,
    sealed: set[int],
    parted: set[int],
    sent_to: Callable[[int, int], int | None] | None = None,
    every: bool = False,
) -> None:
    """Refuse to resume after a hole or an incomplete step: receivers of the missing
    ranks would wait forever for it. A sealed step is whole; a step with parts and no
    seal is the step to finish when it is the last (or the oldest, partly pruned:
    retention deletes a step's seal first). A step sent whole is whole when it has the
    ranks its messages say it was sent to (:func:`_told`); one of a writer that did not
    record them (before 1.8), when it has every rank any such step has files of."""
    steps = sorted(set(mains) | sealed | parted)
    told = _told(mains, sent_to, every)
    untold = [mains[s] | any_file.get(s, set()) for s in mains if told[s] is None]
    ranks = set().union(*untold)
    for step in range(steps[0], steps[-1] + 1):
        have = mains.get(step)
        if step in sealed or (have is None and step in parted and step in (steps[0], steps[-1])):
            continue
        if have is None and step in parted:
            problem = f"step {step} was filled part by part and never sealed"
        elif have is None:
            problem = f"step {step} is missing (a hole)"
        elif step == steps[0] and step != steps[-1] and 0 not in have:
            # The oldest step, partly deleted by retention, which removes main files from
            # rank 0 up (a failed commit shows them from rank 0 up: never lacks rank 0).
            continue
        elif (n := told[step]) is not None:
            # Ranks 0..n-1 without a set of n: a forged n may be 2**63.
            if len(have) == n and max(have) == n - 1:
                continue
            problem = f"step {step} is incomplete (ranks {sorted(have)} of the {n} it was sent to)"
            if max(have) >= n:
                problem = f"step {step} has ranks {sorted(have)}, but was sent to {n}"
        elif have == ranks:
            continue
        else:
            problem = f"step {step} is incomplete (ranks {sorted(have)} of {sorted(ranks)})"
        raise StepExistsError(
            f"cannot resume: {problem}; open the sender with start_step={step}, "
            f"on_existing='truncate' to delete step {step} and every later one, then "
            f"send from step {step} again",
            where=where,
        )
    if first is not None and first > steps[-1] + 1:
        raise StepExistsError(
            f"cannot resume at start_step {first}: the last stored step is {steps[-1]}, "
            f"so steps {steps[-1] + 1}..{first - 1} would be a hole; open the sender with "
            f"start_step={first}, on_existing='truncate' (keeps the stored steps) or "
            "resume without start_step",
            where=where,
        )


def _told(
    mains: dict[int, set[int]], sent_to: Callable[[int, int], int | None] | None, every: bool
) -> dict[int, int | None]:
    """For each step sent whole, how many ranks it was sent to (None: not recorded):
    read for every step if ``every``, else for the first and the last step of each run
    of steps visible for the same ranks, the others taking their run's first step's
    word. A commit cut short is the last step its sender sent, or one it went on after
    (its commit failed), which ends its run unless the steps around it went to exactly
    the ranks it shows: only reading every step (on S3 a request each, made at once) tells it."""
    told: dict[int, int | None] = {}
    for step in sorted(mains):
        have = mains[step]
        if not every and mains.get(step - 1) == have and mains.get(step + 1) == have:
            told[step] = told[step - 1]
        else:
            told[step] = None if sent_to is None else sent_to(step, min(have))
    return told


def names_to_delete(
    names: Iterable[str], on_existing: OnExisting, first: int | None = None
) -> list[list[str]]:
    """What a sender opening with ``on_existing`` and ``start_step=first`` deletes, as
    batches to delete one after the other. ``"overwrite"`` deletes every stored step,
    ``"truncate"`` the steps at or after ``first``, the others none; every mode but
    ``"error"`` deletes an end-of-stream mark, and ``"overwrite"`` and ``"truncate"``
    the ranks' consumption marks and part marks.

    The order keeps a deletion cut short (a kill, an outage) from leaving a state that
    misleads: the marks first (an end mark past the steps kept would stop receivers at
    a hole; a consumption mark of a deleted step would let retention delete the new
    one unread), then the main files step by step from the last (so the steps left are
    never a hole, only a shorter run whose last step ``resume`` may find incomplete),
    then the sidecars (no reader meets a main file without its sidecar). A step filled
    part by part goes with the main files, its seal first, its parts' sidecars last."""
    names = list(names)
    marks = [END_NAME] if END_NAME in names and on_existing != "error" else []
    if on_existing not in ("overwrite", "truncate"):
        return [marks] if marks else []
    marks += sorted(n for n in names if CONSUMED_RE.fullmatch(n) or CONSUMED_PART_RE.fullmatch(n))
    low = first if on_existing == "truncate" and first is not None else 0
    mains: dict[int, list[str]] = {}
    rest: list[str] = []
    for name in sorted(names, key=_seal_first):
        m = STORED_RE.fullmatch(name) or STEP_PART_RE.fullmatch(name) or SEAL_RE.fullmatch(name)
        m = m or FIELDS_RE.fullmatch(name)  # appended fields go with their step
        if m and int(m.group(1)) >= low:
            if name.endswith(".sidecar.rlw"):
                rest.append(name)
            else:
                mains.setdefault(int(m.group(1)), []).append(name)
    batches = [marks] + [mains[s] for s in sorted(mains, reverse=True)] + [sorted(rest)]
    return [batch for batch in batches if batch]


def _seal_first(name: str) -> tuple[bool, str]:
    """Sorts a step's seal before its other files: a deletion cut short leaves a step
    with parts and no seal, never a seal whose parts are gone."""
    return (not SEAL_RE.fullmatch(name), name)
