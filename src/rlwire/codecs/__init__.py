"""Codecs: objects to :class:`~rlwire.Frame` and back. Never imports ``rlwire.transport``.

Codecs are found by name through the ``rlwire.codecs`` entry point group or
:func:`register_codec` (in one process), listed by :func:`available_codecs` and made by
:func:`make_codec`: :class:`MsgpackCodec` (the default) and :class:`JsonCodec`
(``rlwire[json]``, imported on first use) are registered there like any plugin. A codec
author implements :class:`rlwire.abc.Codec`. JSON-lines files are :mod:`rlwire.codecs.jsonl`.
"""

from rlwire._core.faces import claim, names_on_demand
from rlwire.abc import Codec
from rlwire.codecs._msgpack.codec import MsgpackCodec
from rlwire.codecs._registry import (
    GROUP,
    available_codecs,
    get_codec,
    make_codec,
    register_codec,
)

__all__ = [
    "GROUP",
    "Codec",
    "JsonCodec",
    "MsgpackCodec",
    "available_codecs",
    "get_codec",
    "make_codec",
    "register_codec",
]

claim(__name__, globals(), [name for name in __all__ if name != "JsonCodec"])

__getattr__ = names_on_demand(
    __name__,
    optional={"JsonCodec": "rlwire.codecs._json.codec:JsonCodec"},
    extras={"orjson": "json"},
)
