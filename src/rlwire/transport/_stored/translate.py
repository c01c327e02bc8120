"""Backend errors as rlwire's: what a stored sink's primitives raise, translated."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rlwire._core.errors import RlwireError, transport_error

__all__ = ["translate_errors"]


@contextlib.contextmanager
def translate_errors(where: str, action: str) -> Iterator[None]:
    """Turn whatever a backend raises (OSError, botocore, aiohttp, sqlite3, ...) into a
    :class:`~rlwire.errors.TransportError` saying that ``action`` failed at ``where``;
    rlwire's own errors and BaseExceptions (cancellation) pass through.

    Example:
        >>> with translate_errors("memory://run", "list the destination"):
        ...     raise PermissionError(13, "Permission denied")
        Traceback (most recent call last):
        ...
        rlwire.errors.TransportError: memory://run: cannot list the destination: Permission denied
    """
    try:
        yield
    except RlwireError:
        raise
    except Exception as exc:
        raise transport_error(exc, action, where=where) from exc
