"""A sink's files read by prefixes (a sink reads the first bytes of a file, not a
range), for what ``add_fields`` checks and reads through the sink
(:mod:`~rlwire.transport._stored.appended`): a main file's envelope and codec header,
then only as far as the last range asked for, and files read whole."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol

from rlwire._core.errors import CorruptFrameError
from rlwire.transport._stored.layout import _PRELUDE, MAX_ENVELOPE, _envelope
from rlwire.transport._stored.selected import HEAD_BYTES, Ranged

__all__ = ["SinkFile", "whole_main", "whole_side"]

_Bytes = bytes | bytearray | memoryview


class _Sink(Protocol):
    """What of a :class:`~rlwire.transport._stored.sink.StoredSink` this module uses."""

    def load_head(self, name: str, size: int) -> _Bytes | None: ...
    def locate(self, name: str | None = None) -> str: ...
    def errors(
        self, action: str, name: str | None = None
    ) -> contextlib.AbstractContextManager[None]: ...


class SinkFile(Ranged):
    """A main file read through the sink by prefixes: its first :data:`HEAD_BYTES`
    (more when its envelope is longer), then as far as the last range asked for."""

    def __init__(self, sink: _Sink, name: str, head: _Bytes) -> None:
        self.sink, self.name = sink, name
        self.data = memoryview(head)
        if self.data.nbytes >= _PRELUDE.size:
            end = _PRELUDE.size + int(_PRELUDE.unpack_from(self.data)[3])
            if self.data.nbytes < end <= _PRELUDE.size + MAX_ENVELOPE:
                self.data = self._load(end)
        env = _envelope(self.data, sink.locate(name), whole=False)
        self.size, self.id = env.size, env.id

    def _load(self, size: int) -> memoryview:
        with self.sink.errors("read", self.name):
            data = self.sink.load_head(self.name, size)
        if data is None or len(data) < size:
            raise CorruptFrameError(
                f"shorter than {size} bytes (deleted or written again while read?)",
                where=self.sink.locate(self.name),
            )
        return memoryview(data)

    def read(self, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        end = max((stop for _, stop in ranges), default=0)
        if end > self.data.nbytes:
            self.data = self._load(min(end, self.size))
        return [self.data[start:stop] for start, stop in ranges]

    def head(self) -> memoryview:
        return self.data[:HEAD_BYTES] if self.data.nbytes > HEAD_BYTES else self.data


def whole_side(sink: _Sink, name: str) -> memoryview:
    """A sidecar file whole (its length is not in its own prelude: read until short)."""
    size = 1 << 20
    with sink.errors("read", name):
        while True:
            data = sink.load_head(name, size)
            if data is None:
                raise CorruptFrameError(
                    "missing; the main file refers to it", where=sink.locate(name)
                )
            if len(data) < size:
                return memoryview(data)
            size *= 4


def whole_main(sink: _Sink, name: str) -> memoryview | None:
    """The whole main file ``name`` (its envelope says how long it is), or ``None``."""
    with sink.errors("read", name):
        head = sink.load_head(name, HEAD_BYTES)
    if head is None:
        return None
    file = SinkFile(sink, name, head)
    return file.read([(0, file.size)])[0]
