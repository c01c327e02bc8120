"""Argument checks shared by the public entry points."""

from __future__ import annotations

from .errors import ConfigError, RlwireError

__all__ = ["non_negative_int", "positive_int"]


def non_negative_int(value: object, what: str, error: type[RlwireError] = ConfigError) -> int:
    """Return ``value`` if it is a non-negative int (not a bool), else raise ``error``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise error(f"{what} must be a non-negative int, got {value!r}")
    return value


def positive_int(value: object, what: str) -> int:
    """Return ``value`` if it is an int of at least 1 (not a bool), else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    return value
