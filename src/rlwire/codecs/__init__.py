"""Codecs: objects to :class:`~rlwire.Frame` and back. Never imports ``rlwire.transport``.

Codecs are found by name through the ``rlwire.codecs`` entry point group
(:func:`available_codecs`, :func:`make_codec`); :mod:`.compression` compresses the
segments of any codec's frames.
"""

from ._registry import GROUP, Codec, available_codecs, get_codec, make_codec
from .compression import Compressor, acompress, adecompress, compress, decompress
from .msgpack import MsgpackCodec

__all__ = [
    "GROUP",
    "Codec",
    "Compressor",
    "MsgpackCodec",
    "acompress",
    "adecompress",
    "available_codecs",
    "compress",
    "decompress",
    "get_codec",
    "make_codec",
]
