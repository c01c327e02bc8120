"""Deadlines of waits that take a ``timeout`` in seconds (``None``: no limit)."""

from __future__ import annotations

import math
import numbers
import time

from rlwire._core.errors import ConfigError

__all__ = ["deadline_after", "time_left"]


#: Seconds beyond which an int timeout is taken as ``math.inf`` (no float holds 10**400).
_LONGEST = 2**63


def deadline_after(timeout: float | None) -> float | None:
    """When a wait of ``timeout`` seconds begun now ends (:func:`time.monotonic`), or
    ``None`` for a wait without a limit.

    Raises:
        ConfigError: ``timeout`` is neither ``None`` nor a number (NaN, which no time
            ever passes, included).

    Example:
        >>> deadline_after(None) is None, deadline_after(5.0) > time.monotonic()
        (True, True)
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ConfigError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if isinstance(timeout, numbers.Integral) and abs(timeout) > _LONGEST:
        timeout = math.inf if timeout > 0 else -math.inf  # beyond any float (10**400)
    if math.isnan(timeout):
        raise ConfigError(f"timeout must be a number of seconds or None, got {timeout!r}")
    return time.monotonic() + timeout


def time_left(deadline: float | None) -> float | None:
    """The seconds left until ``deadline`` (negative once it passed), or ``None``.

    Example:
        >>> time_left(None) is None, time_left(time.monotonic() - 1) < 0
        (True, True)
    """
    return None if deadline is None else deadline - time.monotonic()
