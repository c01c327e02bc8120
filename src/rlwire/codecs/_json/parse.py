"""JSON text into Python objects, integers exact: the parser of the JSON codec and of
JSON lines.

orjson reads an integer beyond 64 bits (below -2**63 or above 2**64 - 1) as a float,
rounded and without a word: ``123456789012345678901234567890`` came back as
``1.2345678901234568e+29``. rlwire's writers never write such an integer, but a document
written by another tool (Python's ``json``, JavaScript's ``BigInt``, a database export)
may hold one, an id say. msgspec's JSON decoder reads it exactly, as a Python ``int``,
so documents are parsed by it: within a third of orjson's time either way (0.6x on an
array of floats, 1.3x on mixed or string-heavy documents, 2026-12-01), where finding the
long integer literals in the text first would cost a third of a parse. Where msgspec
refuses a document (malformed JSON, nesting beyond Python's recursion limit), orjson
parses it again: it reports malformed JSON as before
(:func:`parse` raises its :class:`orjson.JSONDecodeError`), and it accepts nesting up
to 1024 levels.

Example:
    >>> parse(b'{"id": 123456789012345678901234567890, "x": [0.5, -1]}')
    {'id': 123456789012345678901234567890, 'x': [0.5, -1]}
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

__all__ = ["parse"]

_DECODER = msgspec.json.Decoder()


def parse(text: bytes | memoryview) -> Any:
    """The value of the JSON document ``text``: dicts, lists, strs, ints (exact, of any
    size up to Python's limit on digits), floats, bools and None.

    Raises:
        orjson.JSONDecodeError: ``text`` is not one valid JSON document (orjson's
            message: the callers' wording of malformed JSON is unchanged).
    """
    try:
        return _DECODER.decode(text)
    except (msgspec.DecodeError, RecursionError):
        return orjson.loads(text)
