"""Msgpack codec on msgspec, with numpy arrays and large bytes carried out-of-band.

msgspec copies every byte it encodes. This codec walks the object first and swaps each
numpy array (and each large bytes value) for a small msgpack extension that refers to
an out-of-band buffer; only that small tree goes through msgspec. Decoding rebuilds
arrays as views over the received buffers.

Your own types go at msgspec's speed: the codec looks, in Python, only where a buffer can
be (a Struct field annotated ``list[int]`` cannot hold one), and cuts containers that
would keep msgspec busy for long into chunks encoded one call each, in short time slices,
so your event loop stays responsive; receivers decode those chunks a slice at a time too
(:mod:`rlwire.codecs._msgpack.encode`, :mod:`rlwire.codecs._msgpack.decode`).

Extension types in the header (see docs/format.md and
:mod:`rlwire.codecs._msgpack.extensions`):

* ``1`` out-of-band array: ``[buffer index, dtype, shape, order]``
* ``2`` inline array: ``[dtype, shape, order, raw bytes]`` (arrays below the threshold)
* ``3`` out-of-band bytes: ``[buffer index]``
* ``4`` / ``5`` chunked array / map: ``[buffer index, item count, [start, end, ...]]``,
  each chunk a msgpack array / map in that buffer
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
import numpy as np

from rlwire._core.args import check_int
from rlwire._core.columns import Columns
from rlwire._core.errors import ConfigError
from rlwire._core.slicing import Sliced, run_sliced
from rlwire._frame.frame import Frame
from rlwire._frame.selection import Selection
from rlwire.codecs._msgpack.column_table import (
    ColumnTable,
    StoredColumn,
    describe_columns,
    values_array,
)
from rlwire.codecs._msgpack.decode import Decoding
from rlwire.codecs._msgpack.encode import Encoding
from rlwire.codecs._msgpack.fields import select_fields
from rlwire.codecs._msgpack.received_columns import rows_from_columns
from rlwire.codecs._msgpack.sidecar_names import SidecarNames
from rlwire.codecs._registry import Check

__all__ = ["DEFAULT_INLINE_THRESHOLD", "MsgpackCodec"]

#: Arrays and bytes values at least this large (in bytes) go out-of-band.
DEFAULT_INLINE_THRESHOLD = 4096


class MsgpackCodec:
    """Encode msgspec Structs, dicts and lists holding numpy arrays to :class:`Frame`.

    Args:
        sidecar: field (or dict key) names whose bytes-like and array values, at any
            depth inside the named field, go to the sidecar. A name that matches
            nothing in a message encoded is refused or warned about (see
            :meth:`encode_sliced`).
        inline_threshold: arrays and bytes of at least this many bytes go out-of-band.
        check: called as ``check(struct, path)`` for every Struct the encoder walks;
            rlwire uses it to validate :class:`~rlwire.TrainingSample` in the same pass.

    Raises:
        EncodeError: from :meth:`encode`, naming the path of a value it cannot carry.

    Example:
        >>> import numpy as np
        >>> codec = MsgpackCodec()
        >>> frame = codec.encode({"x": np.arange(10_000)})
        >>> len(frame.buffers)
        1
        >>> codec.decode(frame)["x"][-1]
        np.int64(9999)
    """

    name = "msgpack"

    def __init__(
        self,
        *,
        sidecar: Iterable[str] = (),
        inline_threshold: int = DEFAULT_INLINE_THRESHOLD,
        check: Check | None = None,
    ) -> None:
        names = (sidecar,) if isinstance(sidecar, str) else sidecar
        try:
            self.sidecar = frozenset(names)
        except TypeError:
            raise ConfigError(f"sidecar must be field names, got {sidecar!r}") from None
        if not all(isinstance(name, str) for name in self.sidecar):
            raise ConfigError(f"sidecar names must be strings, got {sidecar!r}")
        self.inline_threshold = check_int(inline_threshold, "inline_threshold")
        self.check = check
        self._encoder = msgspec.msgpack.Encoder()
        self._sidecar_names = SidecarNames(self.sidecar)

    def encode(self, obj: Any) -> Frame:
        """Encode ``obj`` in the calling thread; see :meth:`encode_sliced`."""
        return run_sliced(self.encode_sliced(obj))

    def encode_sliced(self, obj: Any) -> Sliced[Frame]:
        """Encode ``obj`` as a sliced generator (see :mod:`rlwire.abc`).

        Array bytes are never copied, except for arrays that are neither C- nor
        F-contiguous, which are made C-contiguous first.

        A ``sidecar`` name that matches no field or key of ``obj`` is checked (once it
        has matched, or is a field of a type sent, never again): one no message of
        ``obj``'s types can hold raises ConfigError; one a dict's keys could still hold
        in a later message is warned about once (:class:`~rlwire.SidecarWarning`).

        Raises:
            EncodeError: ``obj`` holds a value msgpack cannot carry; names its path.
            ConfigError: a ``sidecar`` name is no field of any Struct (or dataclass,
                TypedDict) type in ``obj``, and ``obj`` holds no dict (nor ``Any``)
                whose keys could take it; names the name and the names there.
        """
        encoding = Encoding(
            self._encoder,
            sidecar=self.sidecar,
            inline_threshold=self.inline_threshold,
            check=self.check,
        )
        frame = yield from encoding.run(obj)
        if self.sidecar:
            yield from self._sidecar_names.check(obj, encoding.matched)
        return frame

    def decode(
        self,
        frame: Frame,
        type: Any = Any,
        *,
        writable: bool = False,
        as_columns: bool = False,
        fields: frozenset[str] | None = None,
    ) -> Any:
        """Decode ``frame`` into ``type`` (default: plain dicts and lists).

        Arrays are views over ``frame.buffers`` (no copy), and so are out-of-band bytes
        received into a field annotated ``memoryview`` (or ``Any``); a field annotated
        ``bytes`` gets a copy. Views are read-only when the buffers are, unless
        ``writable=True``, which copies only read-only ones. A list stored as columns
        (see :mod:`rlwire.codecs._msgpack.sent_columns`) comes back as a list of rows,
        or as an :class:`~rlwire.Columns` with ``as_columns=True``. ``fields`` (names)
        implies ``as_columns`` and keeps only those columns of each such list; the
        frame may then lack the buffers of the others (:meth:`select_fields`).

        Raises:
            CorruptFrameError: the header or an array descriptor is malformed or does
                not match its buffer.
            DecodeError: the data does not match ``type``; the message names the path.
            FieldNotFoundError: a list stored as columns has no column of a name of
                ``fields``.
        """
        sliced = self.decode_sliced(
            frame, type, writable=writable, as_columns=as_columns, fields=fields
        )
        return run_sliced(sliced)

    def decode_sliced(
        self,
        frame: Frame,
        type: Any = Any,
        *,
        writable: bool = False,
        as_columns: bool = False,
        fields: frozenset[str] | None = None,
    ) -> Sliced[Any]:
        """:meth:`decode` as a sliced generator: a header with chunked containers
        decodes one chunk per slice."""
        return (yield from Decoding(frame, writable, as_columns, fields).run(type))

    def select_fields(self, frame: Frame, fields: frozenset[str]) -> Selection | None:
        """The buffers of ``frame`` (its header decompressed, some buffers read) that
        :meth:`decode` with ``fields`` needs; ``None`` when all are
        (:func:`~rlwire.codecs._msgpack.fields.select_fields`).

        Raises:
            FieldNotFoundError: a list stored as columns lacks one of ``fields``.

        Example:
            >>> import numpy as np
            >>> frame = MsgpackCodec().encode({"x": np.arange(10_000)})
            >>> MsgpackCodec().select_fields(frame, frozenset({"x"})) is None  # no columns
            True
        """
        return select_fields(frame, fields)

    def describe_columns(self, frame: Frame) -> ColumnTable | None:
        """The list of samples stored as columns in ``frame``'s (decompressed) header, for
        a manifest (:func:`~rlwire.codecs._msgpack.column_table.describe_columns`).

        Raises:
            CorruptFrameError: the header or its columns value is malformed.
        """
        return describe_columns(frame)

    def rows_of_columns(self, columns: Columns, type: Any, *, heap: int) -> Sliced[list[Any]]:
        """The rows of ``columns`` that a receiver got from this codec (fields may have
        been added since) as ``type`` (a ``list[T]``), made as :meth:`decode` makes a
        list stored as columns, within ``heap`` bytes of Python objects
        (:func:`~rlwire.codecs._msgpack.received_columns.rows_from_columns`).

        Raises:
            DecodeError: the rows do not match ``type``; the path starts at the list.
            FrameTooLargeError: the rows would build more than ``heap`` bytes.
        """
        return (yield from rows_from_columns(columns, type, heap))

    def column_values(
        self, view: memoryview, column: StoredColumn, count: int, writable: bool
    ) -> np.ndarray:
        """``count`` items of ragged ``column``'s values over ``view``
        (:func:`~rlwire.codecs._msgpack.column_table.values_array`).

        Raises:
            CorruptFrameError: ``view`` does not hold exactly that, or the dtype is not plain.
        """
        return values_array(view, column, count, writable)
