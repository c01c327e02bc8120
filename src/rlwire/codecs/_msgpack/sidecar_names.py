"""Sidecar names that match nothing: ``sidecar=("routed_expert",)`` beside a field called
``routed_experts`` would send every step's experts in the main message, silently.

The encoder notes which of the codec's sidecar names it met as a field or key on its
walk. A name met once, or that is a field of a type the messages hold (an optional field
left ``None`` in this step), is settled for good. Of the names left after a message:

* a name that no message of these types can hold (no field of any Struct, dataclass or
  TypedDict type in the message, and nowhere a dict, ``Columns`` or ``Any`` whose keys
  could take it) is refused: :class:`~rlwire.ConfigError`, before anything is written;
* a name that a dict's keys could still take in another step (they vary by step) is
  warned about once, :class:`~rlwire.SidecarWarning`, naming the names that were there;
* a message that tells nothing (an empty list, a lone array: no record type, no dict)
  leaves the names to the next.

Example:
    >>> import msgspec
    >>> from rlwire._core.slicing import run_sliced
    >>> class Sample(msgspec.Struct):
    ...     routed_experts: bytes
    >>> names = SidecarNames(frozenset({"routed_expert"}))
    >>> run_sliced(names.check(Sample(b""), set()))
    Traceback (most recent call last):
    ...
    rlwire.errors.ConfigError: sidecar name 'routed_expert' matches no field or key ...
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import warnings
from typing import Any

import msgspec
import msgspec.inspect as mi
import numpy as np

from rlwire._core.columns import Columns
from rlwire._core.errors import ConfigError, SidecarWarning
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire._core.types import reachable

__all__ = ["SidecarNames"]

_SCALARS = frozenset((str, int, float, bool, type(None)))
# Values no name can be inside.
_LEAVES = (np.ndarray, np.generic, bytes, bytearray, memoryview)
# Items a long list of scalars is checked by at a time (in C).
_SCAN = 65536
# Names a message lists at most.
_SHOWN = 40


@dataclasses.dataclass
class _Seen:
    """What one message holds: the field names of its record types, the keys of its
    dicts and Columns, and whether a dict's keys (varying by step) could hold a name."""

    fields: set[str] = dataclasses.field(default_factory=set)
    keys: set[str] = dataclasses.field(default_factory=set)
    types: set[type] = dataclasses.field(default_factory=set)
    free: bool = False


class SidecarNames:
    """The sidecar names of one codec, and which of them are settled (met as a field or
    key, a field of a type sent, or warned about)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.settled: frozenset[str] = frozenset()

    def check(self, obj: Any, matched: set[str]) -> Sliced[None]:
        """Settle the names the encoder ``matched`` in ``obj``; of those left, refuse the
        ones ``obj``'s types can never hold, and warn once about the others.

        Raises:
            ConfigError: a name is no field of any record type in ``obj``, and ``obj``
                holds no dict (or ``Any``) whose keys could take it; names the name and
                the names there.
        """
        # Rebound, not changed in place: parts encoded at once race to no harm.
        self.settled = self.settled | (matched & self.names)
        left = self.names - self.settled
        if not left:
            return
        seen = yield from _walk(obj)
        if not seen.types and not seen.free:
            return  # no record type, no dict (an empty list, an array): the next may tell
        self.settled = self.settled | (left & seen.fields)
        left -= seen.fields
        if not left:
            return
        there = sorted(seen.fields | seen.keys)
        if not seen.free:
            name = min(left)
            kinds = ", ".join(sorted(t.__qualname__ for t in seen.types)) or "none"
            raise ConfigError(
                f"sidecar name {name!r} matches no field or key of the message"
                f"{_guess(name, there)}: it is no field of its types ({kinds}: "
                f"{_listed(there)}), and the message holds no dict whose keys could "
                "take it. Nothing was sent: correct the name in sidecar="
            )
        self.settled = self.settled | left
        for name in sorted(left):
            warnings.warn(
                f"rlwire: sidecar name {name!r} matched no field or key of the message "
                f"sent{_guess(name, there)}; the names there: {_listed(there)}. Its "
                "values, if a later message holds any, go to the sidecar; a misspelt "
                "name sends them in the main message. Said once per sender and name "
                "(a dict's keys may differ from step to step)",
                SidecarWarning,
                stacklevel=2,
            )


def _guess(name: str, there: list[str]) -> str:
    close = difflib.get_close_matches(name, there, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _listed(names: list[str]) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:_SHOWN])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _SHOWN else "")


@functools.cache
def _record_names(kind: type) -> tuple[frozenset[str], frozenset[type], bool]:
    """The field names (and encoded names) of every Struct, dataclass and TypedDict type
    an annotation of ``kind`` reaches, those types, and whether it reaches a dict or
    ``Any`` (keys that vary by step). A type msgspec cannot inspect: its own fields, and
    keys that may vary."""
    try:
        info = mi.type_info(kind)
    except Exception:  # msgspec raises several types for annotations it cannot resolve
        fields = getattr(kind, "__struct_fields__", ())
        return frozenset(fields), frozenset({kind}), True
    names: set[str] = set()
    kinds: set[type] = set()
    free = False
    for t in reachable(info):
        if isinstance(t, mi.StructType | mi.DataclassType | mi.TypedDictType):
            kinds.add(t.cls)
            names.update(f.name for f in t.fields)
            names.update(f.encode_name for f in t.fields)
        elif isinstance(t, mi.DictType | mi.AnyType) or (
            isinstance(t, mi.CustomType) and t.cls is object
        ):
            free = True
    return frozenset(names), frozenset(kinds), free


def _walk(obj: Any) -> Sliced[_Seen]:
    """What ``obj`` holds (:class:`_Seen`), in slices."""
    seen = _Seen()
    pending = [obj]
    timer = SliceTimer()
    while pending:
        item = pending.pop()
        kind: Any = type(item)
        if kind in _SCALARS or isinstance(item, _LEAVES):
            pass
        elif isinstance(item, msgspec.Struct) or (
            dataclasses.is_dataclass(item) and not isinstance(item, type)
        ):
            if kind not in seen.types:
                names, kinds, free = _record_names(kind)
                seen.fields |= names
                seen.types |= kinds | {kind}
                seen.free = seen.free or free
            pending.extend(_values(item))
        elif isinstance(item, dict):
            seen.free = True
            seen.keys.update(k for k in item if isinstance(k, str))
            pending.extend(item.values())
        elif isinstance(item, Columns):
            seen.free = True
            seen.keys.update(item.names)
            pending.extend(c for c in item.values() if type(c) is list)
        elif isinstance(item, list | tuple):
            yield from _items(item, pending, timer)
        if timer.due():
            yield
            timer.restart()
    return seen


def _values(record: Any) -> list[Any]:
    if isinstance(record, msgspec.Struct):
        names = record.__struct_fields__
    else:
        names = tuple(f.name for f in dataclasses.fields(record))
    return [getattr(record, name) for name in names]


def _items(
    items: list[Any] | tuple[Any, ...], pending: list[Any], timer: SliceTimer
) -> Sliced[None]:
    """Add the items of ``items`` that may hold names to ``pending`` (a long list of
    numbers is looked at in C, a run at a time)."""
    for start in range(0, len(items), _SCAN):
        run = items[start : start + _SCAN]
        if not set(map(type, run)) <= _SCALARS:
            pending.extend(x for x in run if type(x) not in _SCALARS)
        if timer.due():
            yield
            timer.restart()
