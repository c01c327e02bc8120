"""Entry-point plugin lookup shared by the codec and sink registries."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

__all__ = ["load_target", "registered"]


def registered(group: str, builtin: dict[str, str]) -> dict[str, str]:
    """``{name: "module:attr"}`` for ``group``: rlwire's own entries (used when its
    entry points are missing, e.g. when run from a source tree), then installed ones."""
    found = dict(builtin)
    found.update((ep.name, ep.value) for ep in entry_points(group=group))
    return found


def load_target(target: str) -> Any:
    """Import ``"module:attr.sub"`` and return the object it names.

    Raises:
        ImportError: the module (or something it imports) is missing.
        AttributeError: the module has no such attribute.
    """
    module, _, attr = target.partition(":")
    obj: Any = __import__(module, fromlist=[attr] if attr else [])
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj
