"""What decoding msgpack into plain builtins would cost in memory, told without decoding.

A msgpack byte can become a 64-byte Python object (an empty map is one byte; an empty
list, a float, a short string are a few), so a header received as ``Any``, or a field
decoded before conversion, can cost far more than its size: 32 MB of empty arrays
build 2.4 GB of lists. :func:`plain_cost` walks the item headers (never the payloads) and
adds up an upper bound of the objects msgspec would build, stopping as soon as it passes
a limit, so that the decoder can refuse such a header before allocating anything.

The walk is flat: in msgpack a container's items follow its header, so visiting every
item header once, in order, visits the whole tree without recursion.
"""

from __future__ import annotations

import numpy as np

from rlwire.codecs._msgpack.extensions import (
    EXT_ARRAY,
    EXT_BYTES,
    EXT_CHUNKED_ARRAY,
    EXT_CHUNKED_MAP,
    EXT_INLINE_ARRAY,
)

__all__ = ["DICT_ITEM", "LIST_ITEM", "WORST_RATIO", "plain_cost"]

# Bytes of heap per object, upper bounds measured on CPython 3.11-3.13 (sys.getsizeof,
# which counts the GC header, rounded up). A container's items are charged by the
# container: 8 per list slot, 64 per dict entry (its hash table, over-allocated).
_LIST = 56
_LIST_ITEM = LIST_ITEM = 8
_EMPTY_DICT = 64
_DICT = 160
_DICT_ITEM = DICT_ITEM = 64
_INT = 32  # ints outside the cached -5..256
_FLOAT = 24
_STR = 49  # plus one byte per character for ASCII
_WIDE_STR = 80  # plus at most 4 bytes per UTF-8 byte, otherwise
_BYTES = 33
_VIEW = 184  # a memoryview of an out-of-band buffer
_ARRAY_OBJECT = 640  # an ndarray over a view, its shape and strides, and the descriptor decoded
_CHUNKED = 128  # plus 40 per byte of its chunk table (one int per range bound)
_CHUNK_TABLE_BYTE = 40

#: The most a byte of msgpack can cost decoded. Count each item's own cost on its first
#: byte, plus its slot in the container holding it (a map entry, 64, is two slots of
#: 32; an array slot is 8): the dearest bytes are an inline array's fixext1, 641 + 32 on
#: three bytes, and a map's head, 160 + 32 on one (``{{}: {{}: ...}}`` nears 144 a
#: byte). A buffer of ``n`` bytes costs at most ``WORST_RATIO * n``.
WORST_RATIO = 225

# Items of a fixed length, by first byte: (length, cost); (0, 0) for the others.
_FIXED: list[tuple[int, int]] = [(0, 0)] * 256
for _b in range(0x00, 0x80):
    _FIXED[_b] = (1, 0)  # positive fixint: cached
for _b in range(0xE0, 0x100):
    _FIXED[_b] = (1, _INT if _b < 0xFB else 0)  # negative fixint; -5 to -1 are cached
for _b, _length, _cost in (
    (0x80, 1, _EMPTY_DICT),
    (0x90, 1, _LIST),  # empty array
    (0xA0, 1, 0),  # empty string
    (0xA1, 2, 0),  # a one-byte string: an ASCII character, a cached str (runs in bulk)
    (0xC0, 1, 0),  # nil
    (0xC2, 1, 0),  # false
    (0xC3, 1, 0),  # true
    (0xCA, 5, _FLOAT),
    (0xCB, 9, _FLOAT),
    (0xCC, 2, _INT),
    (0xCD, 3, _INT),
    (0xCE, 5, _INT),
    (0xCF, 9, _INT),
    (0xD0, 2, _INT),
    (0xD1, 3, _INT),
    (0xD2, 5, _INT),
    (0xD3, 9, _INT),
):
    _FIXED[_b] = (_length, _cost)
_FIXED_LENGTH = bytes(length for length, _ in _FIXED)
_FIXED_COST = [cost for _, cost in _FIXED]


# Items of one length and cost share a kind; a run of one kind is skipped in bulk.
_KIND = np.array([_FIXED.index(item) if item[0] else 255 for item in _FIXED], np.uint8)
_KINDS = _KIND.tobytes()
# A run is counted in bulk when the item this many items on is of its kind too: below
# that, a numpy call costs more than the items it would skip.
_PROBE = 16
_COOLDOWN = 256
_FIRST_WINDOW = 64
_MAX_WINDOW = 1 << 16


def _run(arr: np.ndarray, pos: int, step: int, end: int, most: int) -> int:
    """How many items of ``step`` bytes and of the kind of the one at ``pos`` follow
    each other from ``pos`` (counting stops past ``most``): lists of token ids, of
    floats, of empty containers are counted in C, a window at a time, not item by
    item."""
    kind = _KIND[arr[pos]]
    count, window = 0, _FIRST_WINDOW
    while pos < end and count <= most:
        firsts = _KIND[arr[pos : min(end, pos + step * window) : step]]
        other = np.flatnonzero(firsts != kind)
        if other.size:
            return count + int(other[0])
        count += firsts.size
        pos += firsts.size * step
        window = min(window * 8, _MAX_WINDOW)
    return count


# Items of a variable length, by first byte: (kind, their length or count when the first
# byte holds it, else minus the bytes of the field that holds it).
_ARRAY, _MAP, _STRING, _BIN, _EXT = range(5)
_VARIABLE: dict[int, tuple[int, int]] = {
    **{b: (_ARRAY, b & 0x0F) for b in range(0x91, 0xA0)},
    **{b: (_MAP, b & 0x0F) for b in range(0x81, 0x90)},
    **{b: (_STRING, b & 0x1F) for b in range(0xA2, 0xC0)},
    0xDC: (_ARRAY, -2),
    0xDD: (_ARRAY, -4),
    0xDE: (_MAP, -2),
    0xDF: (_MAP, -4),
    0xD9: (_STRING, -1),
    0xDA: (_STRING, -2),
    0xDB: (_STRING, -4),
    0xC4: (_BIN, -1),
    0xC5: (_BIN, -2),
    0xC6: (_BIN, -4),
    0xC7: (_EXT, -1),
    0xC8: (_EXT, -2),
    0xC9: (_EXT, -4),
    **{b: (_EXT, 1 << (b - 0xD4)) for b in range(0xD4, 0xD9)},  # fixext 1-16
}
_MALFORMED = (-1, 0)
# What rlwire's extension values cost, without their payload; unknown codes cost
# nothing: the decoder refuses them.
_EXT_COST = {
    EXT_ARRAY: _ARRAY_OBJECT,
    EXT_INLINE_ARRAY: _ARRAY_OBJECT,
    EXT_BYTES: _VIEW,
    EXT_CHUNKED_ARRAY: _CHUNKED,
    EXT_CHUNKED_MAP: _CHUNKED,
}
# Per byte of payload: an inline array's data is copied; a chunk table's ints are built.
_EXT_BYTE_COST = {
    EXT_INLINE_ARRAY: 1,
    EXT_CHUNKED_ARRAY: _CHUNK_TABLE_BYTE,
    EXT_CHUNKED_MAP: _CHUNK_TABLE_BYTE,
}


def plain_cost(data: bytes | memoryview, limit: int) -> int:  # noqa: C901 - a call per item would slow this hot loop
    """An upper bound of the heap, in bytes, that decoding ``data`` (one msgpack value,
    possibly malformed) into plain builtins would take; it stops counting, and returns
    the running total, as soon as that exceeds ``limit``. Malformed input is not
    reported here: the walk just stops where it cannot go on, and the decoder then says
    what is wrong."""
    view = data if isinstance(data, bytes) else bytes(data)  # indexing bytes is faster
    end = len(view)
    pos = cost = cooldown = 0
    fixed_length, fixed_cost, kinds = _FIXED_LENGTH, _FIXED_COST, _KINDS
    variable, ext_cost, ext_byte_cost = _VARIABLE, _EXT_COST, _EXT_BYTE_COST
    arr = np.frombuffer(view, np.uint8)
    while pos < end and cost <= limit:
        b = view[pos]
        step = fixed_length[b]
        if step:
            probe = pos + _PROBE * step
            if cooldown:
                cooldown -= 1
                pos += step
                cost += fixed_cost[b]
            elif probe < end and kinds[view[probe]] == kinds[view[pos + step]] == kinds[b]:
                each = fixed_cost[b]
                count = _run(arr, pos, step, end, (limit - cost) // each if each else end)
                pos += count * step
                cost += count * fixed_cost[b]
                if count < _PROBE:  # mixed items: walk a while before probing again
                    cooldown = _COOLDOWN
            else:
                pos += step
                cost += fixed_cost[b]
            continue
        kind, n = variable.get(b, _MALFORMED)
        pos += 1
        if pos >= end:
            break  # truncated: for the decoder to report
        if n < 0:  # the length or count follows, in -n bytes
            n, pos = (view[pos], pos + 1) if n == -1 else (_uint(view, pos, -n), pos - n)
        if kind == _ARRAY:
            cost += _LIST + _LIST_ITEM * n
        elif kind == _MAP:
            cost += _DICT + _DICT_ITEM * n if n else _EMPTY_DICT
        elif kind == _STRING:
            cost += _str_cost(view, pos, n)
            pos += n
        elif kind == _BIN:
            cost += _BYTES + n
            pos += n
        elif kind == _EXT:
            code = view[pos] if pos < end else -1
            cost += ext_cost.get(code, 0) + ext_byte_cost.get(code, 0) * n
            pos += 1 + n
        else:  # 0xC1, never used: malformed, for the decoder to report
            break
    return cost


def _uint(view: bytes, pos: int, size: int) -> int:
    return int.from_bytes(view[pos : pos + size], "big")


def _str_cost(view: bytes, start: int, length: int) -> int:
    if length <= 1:
        return 0  # the empty string and one-character strings are cached
    if view[start : start + length].isascii():
        return _STR + length
    return _WIDE_STR + 4 * length
