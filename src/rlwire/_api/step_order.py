"""The order in which a sender sends steps: each the one after the last, a fresh
destination starting anywhere."""

from __future__ import annotations

from rlwire._core.args import MAX_STEP, STEP_RANGE, check_int
from rlwire._core.errors import StepOrderError

__all__ = ["resolve_step"]


def resolve_step(step: int | None, next_step: int, last_step: int | None) -> int:
    """The step to send: ``step``, or ``next_step`` when it is ``None``.

    Raises:
        StepOrderError: ``step`` repeats, goes backwards, or skips ahead of
            ``next_step`` (a fresh destination, nothing sent yet, may start anywhere),
            or is beyond the last step a destination can hold.

    Example:
        >>> resolve_step(None, 3, 2), resolve_step(7, 0, None)
        (3, 7)
        >>> resolve_step(5, 3, 2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rlwire.errors.StepOrderError: step 5 skips ahead of step 3; ...
    """
    if step is None:
        step = next_step
    # The last step a destination can hold: a sender opened near it runs out here.
    check_int(step, "step", high=MAX_STEP, error=StepOrderError, why=STEP_RANGE)
    if step == next_step:
        return step
    if step < next_step:
        what = "repeats" if step == last_step else "goes backwards from"
        last = last_step if last_step is not None else next_step - 1
        raise StepOrderError(
            f"step {step} {what} step {last}; steps must increase by 1 (next is {next_step})"
        )
    if last_step is None and next_step == 0:
        return step  # a fresh destination may start anywhere, e.g. after a checkpoint
    raise StepOrderError(
        f"step {step} skips ahead of step {next_step}; a receiver "
        "would wait forever for the missing steps"
    )
