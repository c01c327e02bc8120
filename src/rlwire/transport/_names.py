"""Names of stored messages (files or objects) and where a sender starts among them.

Shared by every sink that stores one message per step and rank under a directory or key
prefix: ``step-00000007.rank-0000.rlw`` holds the main part, ``….sidecar.rlw`` the
sidecar part, and ``.<name>.<random hex>.tmp`` a part being written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .._files import temp_name
from ..errors import StepExistsError
from ._base import OnExisting

__all__ = [
    "MAIN_RE",
    "STORED_RE",
    "TEMP_RE",
    "main_name",
    "sidecar_name",
    "start_step",
    "temp_name",
]

#: A main part; groups: step, rank.
MAIN_RE = re.compile(r"step-(\d+)\.rank-(\d+)\.rlw")
#: A main or sidecar part.
STORED_RE = re.compile(r"step-\d+\.rank-\d+(\.sidecar)?\.rlw")
#: A part still being written (or left behind by a sender that was killed).
TEMP_RE = re.compile(r"\.step-\d+\.rank-\d+(\.sidecar)?\.rlw\.[0-9a-f]+\.tmp")


def main_name(step: int, rank: int) -> str:
    """Name of the main part of ``step`` for ``rank``."""
    return f"step-{step:08d}.rank-{rank:04d}.rlw"


def sidecar_name(step: int, rank: int) -> str:
    """Name of the sidecar part of ``step`` for ``rank``."""
    return f"step-{step:08d}.rank-{rank:04d}.sidecar.rlw"


def start_step(where: str, names: Iterable[str], on_existing: OnExisting) -> int:
    """The first step a sender sends to a destination holding ``names``.

    ``"error"`` refuses a destination with steps in it, ``"resume"`` continues after the
    last step, and ``"overwrite"`` starts at 0 (the caller deletes what is there, main
    parts first, so that no reader meets a main part without its sidecar).

    Raises:
        StepExistsError: ``"error"`` and steps exist; ``"resume"`` and the last step has
            fewer ranks than the one before it.
    """
    ranks: dict[int, set[int]] = {}
    for name in names:
        m = MAIN_RE.fullmatch(name)
        if m:
            ranks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    steps = sorted(ranks)
    if on_existing == "overwrite" or not steps:
        return 0
    if on_existing == "resume":
        if len(steps) >= 2 and len(ranks[steps[-1]]) < len(ranks[steps[-2]]):
            # A send killed between its commits: resuming after it would leave the
            # missing ranks waiting forever for a step that will never come.
            raise StepExistsError(
                f"step {steps[-1]} is incomplete (ranks {sorted(ranks[steps[-1]])} "
                f"of {sorted(ranks[steps[-2]])}); delete it to resume before it, or use "
                "on_existing='overwrite'",
                where=where,
            )
        return steps[-1] + 1
    span = str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"
    raise StepExistsError(
        f"holds steps {span} from an earlier run; open the sender with "
        "on_existing='overwrite' to delete them or on_existing='resume' to continue after them",
        where=where,
    )
