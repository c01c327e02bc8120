"""How a receiver turns a frame into an object: decompress, find the codec the frame
names, decode with the receiver's options (``writable``, ``as_columns``, ``fields``)."""

from __future__ import annotations

import time
from typing import Any

from anyio import CapacityLimiter

from rlwire._api.options import Limits
from rlwire._core.errors import ConfigError, DecodeError, RlwireError
from rlwire._core.offload import thread_count
from rlwire._core.plugin_calls import guarded_sliced, plugin_error
from rlwire._core.slicing import Sliced, timed
from rlwire._frame.compression import decompress_sliced
from rlwire._frame.frame import Frame
from rlwire.codecs._registry import Codec, get_codec, plugin_codec

__all__ = ["FrameDecoding"]


class FrameDecoding:
    """The codecs a receiver loaded, by name, and its decoding options.

    Example:
        >>> from rlwire.codecs._msgpack.codec import MsgpackCodec
        >>> from rlwire._core.slicing import run_sliced
        >>> decoding = FrameDecoding(Limits(), None, writable=False)
        >>> frame = MsgpackCodec().encode({"n": 1})
        >>> run_sliced(decoding.decode(frame, Any, {"decompress": 0.0, "decode": 0.0}, False))
        {'n': 1}
    """

    def __init__(
        self,
        limits: Limits,
        limiter: CapacityLimiter | None,
        *,
        writable: bool,
        fields: frozenset[str] | None = None,
    ) -> None:
        self.limits = limits
        self.limiter = limiter
        self.writable = writable
        self.fields = fields
        self._codecs: dict[str, Codec] = {}

    def codec(self, name: str) -> Codec:
        """The codec registered under ``name``, loaded once.

        Raises:
            DecodeError: no codec of that name can be loaded.
        """
        codec = self._codecs.get(name)
        if codec is None:
            try:
                codec = self._codecs[name] = get_codec(name)()
            except ConfigError as exc:
                raise DecodeError(
                    f"written with codec {name!r}, which this reader cannot load: {exc}"
                ) from None
        return codec

    def decompressed(self, frame: Frame) -> Sliced[Frame]:
        """``frame`` with its segments decompressed (those read), within the limits."""
        if not frame.compression:
            return frame
        return (
            yield from decompress_sliced(
                frame,
                max_bytes=self.limits.max_decompressed_bytes,
                max_ratio=self.limits.max_compression_ratio,
                threads=1 if self.limiter is None else thread_count(self.limiter),
            )
        )

    def decode(
        self, frame: Frame, type_: Any, seconds: dict[str, float], as_columns: bool
    ) -> Sliced[Any]:
        """``frame`` decoded as ``type_``; time spent added to ``seconds``."""
        if frame.compression:
            frame = yield from timed(self.decompressed(frame), seconds, "decompress")
        began = time.perf_counter()
        codec = self.codec(frame.codec)
        # Only codecs that store columns know these keywords (optional for plugin codecs).
        options: dict[str, Any] = {"writable": self.writable}
        if as_columns or self.fields is not None:
            options["as_columns"] = True
        if self.fields is not None:
            options["fields"] = self.fields
        decode_sliced = getattr(codec, "decode_sliced", None)  # optional for plugin codecs
        call = "decode()" if decode_sliced is None else "decode_sliced()"
        plugin = plugin_codec(codec)  # its errors are typed here: PluginError naming it
        try:
            if decode_sliced is None:
                try:
                    return codec.decode(frame, type_, **options)
                finally:
                    seconds["decode"] += time.perf_counter() - began
            sliced = decode_sliced(frame, type_, **options)
        except RlwireError:
            raise
        except Exception as exc:
            if isinstance(exc, TypeError) and len(options) > 1:
                what = "fields" if self.fields is not None else "as_columns"
                raise ConfigError(
                    f"{what}: codec {frame.codec!r} cannot return columns ({exc})"
                ) from None
            if plugin is None:
                raise
            raise plugin_error(exc, plugin, call) from exc
        if plugin is not None:
            sliced = guarded_sliced(sliced, plugin, call)
        return (yield from timed(sliced, seconds, "decode"))
