"""Manifest: a handle on one committed message (a step's, or a part's, for one rank),
small and serialisable, that an orchestrator passes instead of the bytes.

A receiver makes one from the message's envelope and codec header alone
(``receiver.manifest(step)``); any receiver of the same store reads rows of its columns
through it (``receiver.read_rows(manifest, "token_ids", a, b)``,
:mod:`rlwire._api.row_reads`). Its wire form is msgpack (or JSON) of the Struct, a map
with the field names below (docs/format.md, *Manifests*).
"""

from __future__ import annotations

import msgspec

from rlwire._core.errors import DecodeError

__all__ = ["Manifest", "ManifestColumn"]


class ManifestColumn(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One column of a message's list of samples stored column by column.

    Attributes:
        name: the field's name (``token_ids``).
        dtype: numpy's dtype string of a ragged column's values (``<i4``); ``None``
            for a column of other values (floats, strings, ...) kept in the codec header,
            and for an array of one value a row (a numpy column of a
            :class:`~rlwire.Columns`, with its size and buffer), which
            :meth:`~rlwire.TrainingBatchReceiver.read_rows` does not read.
        row_shape: the shape of a row's value past its first axis: ``()`` for per-token
            scalars, ``(layers, topk)`` for ``routed_experts``.
        size: the bytes stored for it: its buffers as stored (compressed if they are),
            and its arrays small enough to be inline in the codec header.
        buffers: the indices of its out-of-band buffers in the message: the values',
            then the offsets' (an inline array has none).
        checksums: the XXH3-64 of each of ``buffers``, as stored; empty when the
            writer recorded none.
    """

    name: str
    dtype: str | None = None
    row_shape: tuple[int, ...] = ()
    size: int = 0
    buffers: tuple[int, ...] = ()
    checksums: tuple[int, ...] = ()


class Manifest(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What one committed message holds: its columns, rows, sizes and checksums.

    Made by :meth:`~rlwire.TrainingBatchReceiver.manifest` from the message's envelope
    and codec header only; read through by
    :meth:`~rlwire.TrainingBatchReceiver.read_rows`. Encode it with msgspec
    (:meth:`encode`, or ``msgspec.json.encode``) to hand it on; rlwire never pickles it.

    Attributes:
        url: the store it is in, as the receiver that made it names it.
        step: its step.
        rank: the rank it is for.
        part: its index among the rank's parts of the step; ``None`` for a whole step.
        key: the part's key (``None`` for a whole step).
        id: the message's random id (16 bytes, from its envelope): a message written
            again under the same name has another, and a read through an old manifest
            raises :class:`~rlwire.StaleManifestError`.
        codec: the codec that wrote it (``msgpack``).
        size: the bytes stored for it: main file and sidecar.
        rows: the rows (samples) of its list of samples stored column by column;
            ``None`` when it holds none.
        field: where that list is: ``samples`` for a whole step's
            :class:`~rlwire.TrainingBatch`, ``None`` for a part (the list itself).
        columns: its columns, in stored order.
        header_checksum: the XXH3-64 of its codec header as stored (``None`` without
            checksums).

    Example:
        >>> m = Manifest(url="/data/run", step=3, rank=0, id=bytes(16), codec="msgpack",
        ...              size=4096, rows=2, field="samples",
        ...              columns=(ManifestColumn(name="token_ids", dtype="<i4"),))
        >>> Manifest.decode(m.encode()) == m
        True
    """

    url: str
    step: int
    rank: int
    part: int | None = None
    key: str | int | None = None
    id: bytes
    codec: str
    size: int
    rows: int | None = None
    field: str | int | None = None
    columns: tuple[ManifestColumn, ...] = ()
    header_checksum: int | None = None

    def column(self, name: str) -> ManifestColumn | None:
        """The column called ``name``, or ``None``."""
        return next((c for c in self.columns if c.name == name), None)

    def encode(self) -> bytes:
        """Its wire form: msgpack of this Struct (a map; docs/format.md)."""
        return _encoder.encode(self)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Manifest:
        """The manifest ``data`` (:meth:`encode`'s bytes) holds.

        Raises:
            DecodeError: ``data`` is not a manifest, naming what is wrong.
        """
        try:
            return _decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise DecodeError(f"not an rlwire manifest: {exc}") from None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Manifest)
