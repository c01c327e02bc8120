"""The one argument check shared by every entry point that takes a count or a size."""

from __future__ import annotations

from rlwire._core.errors import ConfigError, RlwireError

__all__ = ["check_int", "check_positive"]


def check_int(
    value: object,
    what: str,
    *,
    low: int = 0,
    high: int | None = None,
    error: type[RlwireError] = ConfigError,
) -> int:
    """Return ``value`` if it is an int (not a bool) from ``low`` to ``high``, else raise
    ``error`` naming ``what``.

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
        raise error(f"{what} must be an int {span}, got {value!r}")
    return value


def check_positive(value: object, what: str) -> float:
    """Return ``value`` if it is a positive int or float (not a bool), else raise
    :class:`ConfigError` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{what} must be a positive number, got {value!r}")
    return float(value)
