"""Where a value sits inside an object, as error messages show it: ``$.samples[1]['a b']``.

Codecs and :class:`~rlwire.Checks` build a path as a linked list, ``(parent, key)``, one
tuple per step down, which costs nothing until an error needs it rendered.

Example:
    >>> render_path(((((None, "samples"), 1), "a b")))
    "$.samples[1]['a b']"
"""

from __future__ import annotations

from typing import TypeAlias

__all__ = ["KeyPath", "render_path"]

# A path is a linked list (parent, key) rendered only when an error needs it.
KeyPath: TypeAlias = "tuple[KeyPath, str | int] | None"


def render_path(path: KeyPath) -> str:
    """``path`` as error messages show it, e.g. ``$.samples[1]['a b']``."""
    keys: list[str | int] = []
    while path is not None:
        path, key = path
        keys.append(key)
    out = ["$"]
    for key in reversed(keys):
        out.append(f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]")
    return "".join(out)
