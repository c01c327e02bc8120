"""The words of a fence's refusal, the same on every sink that fences (files, S3 and
other fsspec stores: ``_stored.fence``; ``ray://``: its board's ``_board_fence``)."""

from __future__ import annotations

__all__ = ["fenced"]


def fenced(what: str, on_existing: str | None) -> str:
    """Why a fenced sender's call to ``what`` is refused: another sender opened the
    destination (with ``on_existing``, when the sink knows it) after it did.

    Example:
        >>> fenced("commit step 3", "resume").split(":")[0]
        'cannot commit step 3'
    """
    how = "" if on_existing is None else f" (on_existing={on_existing!r})"
    return (
        f"cannot {what}: another sender opened the destination{how} after this one did, "
        "and the destination is that sender's now: this one is fenced off, nothing of "
        "this call was stored, and every later call of it is refused the same way; stop "
        "this producer (a destination has one producer: give each its own destination)"
    )
