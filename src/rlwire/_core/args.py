"""The one argument check shared by every entry point that takes a count, a size or a
step."""

from __future__ import annotations

from rlwire._core.errors import ConfigError, RlwireError

__all__ = ["MAX_STEP", "STEP_RANGE", "check_bool", "check_int", "check_positive", "check_step"]

#: The highest step a sender may send: the format stores a step as a u64, and the end
#: mark records the step after the last one sent (docs/format.md), which must fit too.
MAX_STEP = 2**64 - 2
#: Why :data:`MAX_STEP` is where it is, for error messages.
STEP_RANGE = "2**64 - 2: steps are stored as u64, and the end mark as the step after the last"


def check_int(
    value: object,
    what: str,
    *,
    low: int = 0,
    high: int | None = None,
    error: type[RlwireError] = ConfigError,
    why: str = "",
) -> int:
    """Return ``value`` if it is an int (not a bool) from ``low`` to ``high``, else raise
    ``error`` naming ``what`` (and, in parentheses after the range, ``why`` if given).

    Example:
        >>> check_int(3, "rank")
        3
        >>> check_int(0, "keep_last", low=1)
        Traceback (most recent call last):
        ...
        rlwire.errors.ConfigError: keep_last must be an int of at least 1, got 0
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        span = f"from {low} to {high}" if high is not None else f"of at least {low}"
        because = f" ({why})" if why else ""
        raise error(f"{what} must be an int {span}{because}, got {value!r}")
    return value


def check_positive(value: object, what: str) -> float:
    """Return ``value`` if it is a positive int or float (not a bool), else raise
    :class:`ConfigError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def check_bool(value: object, what: str) -> bool:
    """Return ``value`` if it is True or False, else raise :class:`ConfigError` naming
    ``what`` (a string such as ``"false"`` from a config file would count as true).

    Example:
        >>> check_bool("no", "checksum")
        Traceback (most recent call last):
        ...
        rlwire.errors.ConfigError: checksum must be True or False, got 'no'
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{what} must be True or False, got {value!r}")
    return value


def check_step(value: object, what: str) -> int:
    """Return ``value`` if it is a step a sender may send, an int from 0 to
    :data:`MAX_STEP` (2**64 - 2), else raise :class:`ConfigError` naming ``what`` and
    the range.

    Example:
        >>> check_step(2**64 - 2, "start_step") == MAX_STEP
        True
        >>> check_step(2**64 - 1, "start_step")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        rlwire.errors.ConfigError: start_step must be an int from 0 to 18446744073709551614 (...
    """
    return check_int(
        value,
        what,
        high=MAX_STEP,
        why=STEP_RANGE,
    )
