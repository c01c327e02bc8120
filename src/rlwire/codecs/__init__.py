"""Codecs: objects to :class:`~rlwire.Frame` and back. Never imports ``rlwire.transport``."""

from .msgpack import MsgpackCodec

__all__ = ["MsgpackCodec"]
