"""Which names a field appended to a step may not take (:mod:`rlwire._api.appending`):
a name the step holds data in, or one appended already, under any of its spellings.

A step stores its samples' fields under their encoded names: a user Struct with
``rename="camel"`` stores ``token_ids`` as ``tokenIds``. A receiver of that Struct
sets an appended field on its samples by either name (the encoded one is a column of
the step, the attribute name a field of the Struct), so ``add_fields`` refuses both:
two names collide when they are spelt alike but for case, ``_`` and ``-``, which is
what msgspec's renames (``lower``, ``upper``, ``camel``, ``pascal``, ``kebab``) change.
A rename by a mapping or a function is not told from the step as stored: a receiver
refuses such a field instead (:mod:`rlwire._api.merged_fields`).

A list of samples stored by position (``array_like`` Structs of several types, kept
as a plain list of lists) keeps no names at all: any name could be one of its fields,
so ``add_fields`` refuses to append to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlwire._core.errors import SchemaError

__all__ = ["check_names", "collision", "spelling", "unnamed_sample"]


def spelling(name: str) -> str:
    """``name`` as the names it collides with all read: lower case, no ``_`` or ``-``.

    Example:
        >>> spelling("token_ids") == spelling("tokenIds") == spelling("Token-Ids")
        True
    """
    return name.replace("_", "").replace("-", "").lower()


def collision(name: str, names: Iterable[str]) -> str | None:
    """The first of ``names`` that ``name`` collides with (itself first), or ``None``.

    Example:
        >>> collision("ref_logprobs", ["tokenIds", "refLogprobs"])
        'refLogprobs'
        >>> collision("score", ["tokenIds"]) is None
        True
    """
    names = list(names)
    if name in names:
        return name
    key = spelling(name)
    return next((n for n in names if spelling(n) == key), None)


def unnamed_sample(samples: Any) -> str | None:
    """What the first sample of a plain list of samples that keeps no names is (a list:
    an ``array_like`` Struct's fields by position), or ``None`` when all are maps."""
    for i, sample in enumerate(samples if isinstance(samples, list) else ()):
        if not isinstance(sample, dict):
            return f"row {i} is a {type(sample).__name__}, not a map of names"
    return None


def check_names(
    name: str, appended: Iterable[str], held: Iterable[str], unnamed: str | None
) -> None:
    """Refuse the appended field ``name`` if it collides with one ``appended`` already
    or one the step holds data in (``held``), or the step's samples keep no names
    (``unnamed`` says why).

    Raises:
        SchemaError: names the field and the name it collides with.
    """
    other = collision(name, appended)
    if other is not None:
        also = "" if other == name else f" (as {other!r})"
        raise SchemaError(f"add_fields: field {name!r} was appended to the step already{also}")
    other = collision(name, held)
    if other is not None:
        also = "" if other == name else f" as {other!r} (the same field, spelt otherwise)"
        raise SchemaError(
            f"add_fields: the step holds data in field {name!r}{also}: an appended field "
            "may take the place of a field the step left empty (None), never of its data"
        )
    if unnamed is not None:
        raise SchemaError(
            f"add_fields: field {name!r}: the step's samples are stored by position "
            f"({unnamed}: array_like Structs of several types, say), so their field "
            "names are not stored and an appended field could take the place of their "
            "data; send them as one Struct type, or as dicts, to append fields"
        )
