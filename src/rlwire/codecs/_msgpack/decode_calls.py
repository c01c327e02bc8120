"""The msgspec decode calls of one frame, each short and within the frame's heap allowance.

Decoding into plain builtins can build far more than the message's size (see
:mod:`rlwire.codecs._msgpack.cost`): each such call is charged against an allowance, and
refused before it starts if it would pass it. A long msgpack array or map is not decoded
in one call either: each array or bytes value in it costs a Python callback, and
thousands of them in one call would hold the GIL for tens of ms.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from rlwire._core.errors import CorruptFrameError, RlwireError
from rlwire._core.slicing import Sliced, SliceTimer
from rlwire.codecs._msgpack.allowance import HeapAllowance
from rlwire.codecs._msgpack.conversion import dec_hook

__all__ = ["ITEMWISE_BYTES", "DecodeCalls"]

#: A msgpack array or map this long or longer is not decoded in one msgspec call. An
#: array's items are decoded in runs of about this many bytes, a map's values one by one,
#: several calls to a time slice.
ITEMWISE_BYTES = 8 << 10
# An item of a long array this large is taken apart itself; smaller ones are decoded
# in runs of ITEMWISE_BYTES or so.
_ITEMWISE_BIG = 1 << 20
# How deep inside a message containers are taken apart item by item.
_ITEMWISE_DEPTH = 4
# Items smaller than this on average are decoded in one call.
_ITEMWISE_MIN_ITEM = 64
_STRUCT_HINT = (
    ". Received into a Struct type, fields the type does not declare are skipped "
    "without being built"
)
_raw_items = msgspec.msgpack.Decoder(list[msgspec.Raw])
_raw_values = msgspec.msgpack.Decoder(dict[str, msgspec.Raw])


def _container(view: memoryview) -> type | None:
    """``list`` or ``dict`` if ``view`` is a msgpack array or map worth decoding item by
    item (see :data:`ITEMWISE_BYTES`), else None. Tiny items (numbers, empty lists)
    call no hook, and a view of each would cost more than the item: those go whole."""
    if view.nbytes < ITEMWISE_BYTES:
        return None
    first = view[0]
    if 0x80 <= first <= 0x8F:  # fixmap: a Struct's fields, say
        return dict
    widths = {0xDC: (list, 2), 0xDD: (list, 4), 0xDE: (dict, 2), 0xDF: (dict, 4)}
    if first not in widths:
        return None
    kind, width = widths[first]
    count = int.from_bytes(view[1 : 1 + width], "big")
    return kind if count * _ITEMWISE_MIN_ITEM <= view.nbytes else None


class DecodeCalls:
    """The decode calls of one frame, all with ``ext_hook``, within the frame's ``heap``
    allowance of Python objects."""

    def __init__(
        self,
        heap: HeapAllowance,
        ext_hook: Callable[[int, memoryview], Any],
        timer: SliceTimer,
    ) -> None:
        self.ext_hook = ext_hook
        self.timer = timer
        self.heap = heap
        self.typed: dict[Any, msgspec.msgpack.Decoder[Any]] = {}

    def decode(self, data: bytes | memoryview | msgspec.Raw, annotation: Any = None) -> Any:
        """One msgspec call: ``data`` as ``annotation`` (None: plain builtins), charged
        against the allowance either way: values of a type cost no more than the plain
        builtins of the same data (a Struct is smaller than a dict, fields it does not
        declare are skipped), so a chunk decoded straight into ``list[list[int]]`` is
        bounded as it would be into ``Any``."""
        charged = self.heap.charge_decode(data, hint=_STRUCT_HINT)
        try:
            if annotation is None:
                return msgspec.msgpack.decode(data, ext_hook=self.ext_hook)
            decoder = self.typed.get(annotation)
            if decoder is None:
                decoder = self.typed[annotation] = msgspec.msgpack.Decoder(
                    annotation, ext_hook=self.ext_hook, dec_hook=dec_hook
                )
            return decoder.decode(data)
        except RlwireError:
            raise
        except msgspec.ValidationError as exc:
            if annotation is not None:
                self.heap.refund(data, charged)  # what it built is gone
                raise  # the caller tries again into plain builtins
            raise CorruptFrameError(f"header: {exc}") from exc  # e.g. a bad timestamp
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise CorruptFrameError(f"header: {exc}") from exc
        except (TypeError, ValueError) as exc:  # e.g. a bytes extension used as a map key
            raise CorruptFrameError(f"header: malformed: {exc}") from exc

    def charge(self, nbytes: int, what: str) -> None:
        """Take ``nbytes`` of Python objects that are about to be made (``what``) from
        the allowance, or refuse them.

        Raises:
            FrameTooLargeError: more than what is left of the allowance.
        """
        self.heap.charge(nbytes, what)

    def plain(self, data: bytes | memoryview | msgspec.Raw, depth: int = 0) -> Sliced[Any]:
        """``data`` decoded into plain builtins; a long msgpack array in runs of items,
        and a map with string keys value by value, down to :data:`_ITEMWISE_DEPTH`
        levels (see :data:`ITEMWISE_BYTES`)."""
        kind = _container(memoryview(data).cast("B")) if depth < _ITEMWISE_DEPTH else None
        try:
            if kind is dict:
                fields = _raw_values.decode(data)
            elif kind is list:
                items = _raw_items.decode(data)
            else:
                return self.decode(data)
        except (msgspec.DecodeError, RecursionError):  # keys other than strings, malformed
            return self.decode(data)  # the whole decode says what is wrong, if anything
        if kind is dict:
            out: dict[str, Any] = {}
            for key, value in fields.items():
                out[key] = yield from self.plain(value, depth + 1)
            return out
        values: list[Any] = []
        run: list[msgspec.Raw] = []  # small items, decoded together as one array
        run_bytes = 0
        for item in items:
            size = len(memoryview(item))
            if size >= _ITEMWISE_BIG:  # e.g. a list of lists of samples
                values += self._run(run)
                run, run_bytes = [], 0
                values.append((yield from self.plain(item, depth + 1)))
            else:
                run.append(item)
                run_bytes += size
                if run_bytes < ITEMWISE_BYTES:
                    continue
                values += self._run(run)
                run, run_bytes = [], 0
            if self.timer.due():
                yield
                self.timer.restart()
        values += self._run(run)
        return values

    def _run(self, items: list[msgspec.Raw]) -> list[Any]:
        """Consecutive small items of an array, decoded in one call (as an array of
        them: one call per item would cost more than the item)."""
        if len(items) < 2:
            return [self.decode(item) for item in items]
        joined = b"\xdd" + len(items).to_bytes(4, "big") + b"".join(items)
        decoded: list[Any] = self.decode(joined)
        return decoded
