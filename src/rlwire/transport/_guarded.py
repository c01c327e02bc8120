"""The calls of a plugin's sink, source and staged step that rlwire guards
(:func:`~rlwire._core.plugin_calls.guard_class`), and what each must return.

:class:`~rlwire.abc.Sink`, :class:`~rlwire.abc.Source` and :class:`~rlwire.abc.Staged`
guard each subclass defined outside rlwire as it is defined: a call the sender or the
receiver makes of it that raises anything but an rlwire error (a bare ``ValueError``, a
``KeyError`` of its backend) raises a :class:`~rlwire.PluginError` naming the class, its
URL scheme, the call and the step, the original chained; one that returns what its call
does not (a ``stage`` returning a str, a ``read`` returning bytes) is refused the same
way, before rlwire uses it. A staged step whose commit fails so has an unknown
visibility (:attr:`~rlwire.abc.Staged.visible` None, unless the sink set it True).
"""

from __future__ import annotations

import numbers
from typing import Any

from rlwire._core.plugin_calls import Returns, guard_class
from rlwire._frame.frame import Frame
from rlwire.transport._parts import PartInfo, Seal

__all__ = ["guard_sink", "guard_source", "guard_staged", "serves"]

#: The schemes each sink class was loaded or registered for (the registry says).
_SCHEMES: dict[type, set[str]] = {}


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _frame_or_none(value: object) -> bool:
    return value is None or isinstance(value, Frame)


def _step_frame_or_none(value: object) -> bool:
    return value is None or (
        isinstance(value, tuple)
        and len(value) == 2
        and _is_int(value[0])
        and isinstance(value[1], Frame)
    )


def _part_or_none(value: object) -> bool:
    return value is None or (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], PartInfo)
        and isinstance(value[1], Frame)
    )


_INT: Returns = (_is_int, "an int")
_FRAME: Returns = (_frame_or_none, "a rlwire.Frame or None")
_NEXT: Returns = (_step_frame_or_none, "(step, rlwire.Frame) or None")
_PART: Returns = (_part_or_none, "(rlwire.abc.PartInfo, rlwire.Frame) or None")
_SEAL: Returns = (lambda v: v is None or isinstance(v, Seal), "a rlwire.abc.Seal or None")


def _unknown_if_unsaid(staged: Any) -> None:
    """A commit that raised something other than an rlwire error did not say what it
    left visible: unknown, unless the sink said some of it is."""
    if getattr(staged, "visible", False) is False:
        staged.visible = None


_Calls = dict[str, tuple[Returns | None, Returns | None, Any]]


def _instance(of: type, wants: str) -> Returns:
    return (lambda value: isinstance(value, of), wants)


def _sink_calls(sink: type, source: type, staged: type) -> _Calls:
    """name: (what it returns, what the sliced generator it returns returns, on failure)."""
    made = _instance(staged, "a rlwire.abc.Staged")
    return {
        "from_url": (_instance(sink, "a rlwire.abc.Sink"), None, None),
        "open_source": (_instance(source, "a rlwire.abc.Source"), None, None),
        "open": (_INT, None, None),
        "aopen": (_INT, None, None),
        "stage": (None, made, None),
        "finish": (None, None, None),
        "afinish": (None, None, None),
        "read_consumption": (None, None, None),
        "check_retention": (None, None, None),
        "check_ranks": (None, None, None),
        "prune": (None, None, None),
        "close": (None, None, None),
        "aclose": (None, None, None),
        "committed_parts": (None, None, None),
        "stage_part": (None, made, None),
        "seal": (None, None, None),
        "aseal": (None, None, None),
        "attach_fields": (None, None, None),
        "read_committed": (None, None, None),
        "read_appended": (None, None, None),
        "stage_fields": (None, made, None),
    }


_SOURCE_CALLS: _Calls = {
    "read": (_FRAME, None, None),
    "read_next": (_NEXT, None, None),
    "read_part": (_PART, None, None),
    "read_seal": (_SEAL, None, None),
    "moved_to": (_INT, None, None),
    "first_part": (None, None, None),
    "part_key": (None, None, None),
    "read_appended": (None, None, None),
    "appended_still_tied": (None, None, None),
    "expect_fields": (None, None, None),
    "mark_consumed": (None, None, None),
    "mark_part": (None, None, None),
    "read_part_of": (None, None, None),
    "read_consumption": (None, None, None),
    "wait": (None, None, None),
    "await_message": (None, None, None),
    "close": (None, None, None),
}

_STAGED_CALLS: _Calls = {
    "commit": (None, None, _unknown_if_unsaid),
    "acommit": (None, None, _unknown_if_unsaid),
    "discard": (None, None, None),
}


def _named(obj: object) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def serves(cls: object, scheme: str) -> None:
    """Record that ``cls`` serves ``scheme``, for errors to name it."""
    if isinstance(cls, type):
        _SCHEMES.setdefault(cls, set()).add(scheme)


def _sink(obj: object) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    schemes = sorted(_SCHEMES.get(cls, ()))
    served = f" (scheme {', '.join(map(repr, schemes))})" if schemes else ""
    return f"the sink plugin {_named(obj)}{served}"


def guard_sink(cls: type, *, sink: type, source: type, staged: type) -> None:
    """Guard the calls ``cls`` (a plugin's subclass of ``sink``) defines; ``source`` and
    ``staged`` are what some of them return."""
    guard_class(cls, _sink, _sink_calls(sink, source, staged))


def guard_source(cls: type) -> None:
    """Guard the calls ``cls`` (a plugin's source class) defines."""
    guard_class(cls, lambda obj: f"the source plugin {_named(obj)}", _SOURCE_CALLS)


def guard_staged(cls: type) -> None:
    """Guard the calls ``cls`` (a plugin's staged step) defines."""
    guard_class(cls, lambda obj: f"the staged step of plugin {_named(obj)}", _STAGED_CALLS)
