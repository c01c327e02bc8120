"""The entry points of one group, read one installed distribution at a time.

:func:`importlib.metadata.entry_points` parses every distribution's
``entry_points.txt`` in one go, so a single malformed file anywhere (a line without
``=``, even under ``[console_scripts]``) makes it raise a bare ``TypeError`` or
``ValueError``, and with it every lookup of a codec or sink. Here a distribution whose
entry points cannot be read is skipped, with a warning naming it once per process, and
the others (rlwire's own among them) are read as usual.
"""

from __future__ import annotations

import re
import threading
import warnings
from importlib.metadata import Distribution, EntryPoint, distributions

__all__ = ["group_entry_points"]

_warned: set[str] = set()
_lock = threading.Lock()


def _name(dist: Distribution) -> str | None:
    try:
        name = dist.name
    except Exception:  # metadata as broken as its entry points
        return None
    return name if isinstance(name, str) and name else None


def _where(dist: Distribution) -> str:
    try:
        return str(dist.locate_file(""))
    except Exception:
        return "an unknown place"


def group_entry_points(group: str) -> list[EntryPoint]:
    """The entry points in ``group`` of every installed distribution whose entry points
    can be read; the first of distributions sharing a name, as
    :func:`importlib.metadata.entry_points` does.

    Warns (RuntimeWarning), once per distribution and process, naming a distribution
    it skips.
    """
    seen: set[str] = set()
    found: list[EntryPoint] = []
    for dist in distributions():
        name = _name(dist)
        if name is not None:
            key = re.sub(r"[-_.]+", "-", name).lower()
            if key in seen:
                continue
            seen.add(key)
        try:
            found.extend(dist.entry_points.select(group=group))
        except Exception as exc:
            _warn(name, _where(dist), exc)
    return found


def _warn(name: str | None, where: str, exc: Exception) -> None:
    shown = f"the installed package {name!r} (in {where})" if name else f"a package in {where}"
    with _lock:
        if shown in _warned:
            return
        _warned.add(shown)
    warnings.warn(
        f"rlwire skips the entry points of {shown}: its entry_points.txt cannot be read "
        f"({type(exc).__name__}: {exc}); codecs or sinks it registers are not found",
        RuntimeWarning,
        stacklevel=2,
    )
