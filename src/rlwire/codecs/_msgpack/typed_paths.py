"""Paths through received data (raw keys: a map's keys, an array's positions), followed
through the typed result and through the receiver's annotation.

A chunked container is found in the raw data at such a path; the typed result holds the
container to fill at the same path, where a map-encoded Struct's field is its encoded
name and an array-like one's its position.

Example:
    >>> import msgspec
    >>> class Rollout(msgspec.Struct):
    ...     samples: list[list[int]]
    >>> path = [("samples", dict), (1, list)]
    >>> follow(Rollout([[1], [2, 3]]), path)
    [2, 3]
    >>> annotation_at(Rollout, path)
    list[int]
"""

from __future__ import annotations

from typing import Any

import msgspec

from rlwire._core.types import child_annotation, field_at

__all__ = ["CannotFollow", "RawStep", "annotation_at", "follow", "put", "render_raw", "steps"]


class CannotFollow(Exception):
    """The typed result has no container to fill where the raw one had a chunked one."""


#: A step of a path through raw data: (key, the kind of container it indexes).
RawStep = tuple[Any, type]


def steps(chain: tuple[Any, ...]) -> list[RawStep]:
    """The steps of a path chain ``(parent chain, step)``, root first."""
    out: list[RawStep] = []
    while chain:
        chain, step = chain
        out.append(step)
    out.reverse()
    return out


def render_raw(path: list[RawStep]) -> str:
    """``path`` as msgspec's errors write paths: ``$.a[0].b``."""
    return "$" + "".join(f"[{key}]" if kind is list else f".{key}" for key, kind in path)


def follow(typed: Any, path: list[RawStep]) -> Any:
    """The value at ``path`` (raw keys) inside the typed object."""
    for key, _ in path:
        if isinstance(typed, msgspec.Struct):
            field = field_at(type(typed), key)
            if field is None:
                raise CannotFollow
            typed = getattr(typed, field.name)
        elif isinstance(typed, dict | list):
            try:
                typed = typed[key]
            except (KeyError, IndexError, TypeError):
                raise CannotFollow from None
        else:
            raise CannotFollow
    return typed


def put(container: Any, path: list[RawStep], value: Any) -> None:
    """Set the value at ``path`` (raw keys) inside ``container`` to ``value``."""
    parent, (key, _) = follow(container, path[:-1]), path[-1]
    if isinstance(parent, msgspec.Struct):
        field = field_at(type(parent), key)
        if field is None:
            raise CannotFollow
        msgspec.structs.force_setattr(parent, field.name, value)
    elif isinstance(parent, dict | list):
        parent[key] = value
    else:
        raise CannotFollow


def annotation_at(annotation: Any, path: list[RawStep]) -> Any:
    """The annotation at ``path`` inside ``annotation``; None when it cannot be told."""
    for key, container in path:
        if annotation is None:
            return None
        annotation = child_annotation(annotation, key, container)
    return annotation
