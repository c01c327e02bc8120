"""Codecs: objects to :class:`~rlwire.Frame` and back. Never imports ``rlwire.transport``.

Codecs are found by name through the ``rlwire.codecs`` entry point group
(:func:`available_codecs`, :func:`make_codec`); :mod:`rlwire.compression` compresses the
segments of any codec's frames, which are Frames by then.
"""

from ._registry import GROUP, Codec, available_codecs, get_codec, make_codec
from .msgpack import MsgpackCodec

__all__ = [
    "GROUP",
    "Codec",
    "MsgpackCodec",
    "available_codecs",
    "get_codec",
    "make_codec",
]
