"""Temporary names for files and objects being written, shared by the stores and by
JSON lines: a part is written under a fresh hidden name beside its final one and moved
into place only when complete, so that no reader ever sees part of it."""

from __future__ import annotations

import os

__all__ = ["temp_name"]


def temp_name(name: str) -> str:
    """A fresh temporary name to write the file or object called ``name`` under.

    Example:
        >>> temp_name("step-00000007.rank-0000.rlw").endswith(".tmp")
        True
    """
    return f".{name}.{os.urandom(6).hex()}.tmp"
