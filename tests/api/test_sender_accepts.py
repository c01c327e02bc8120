"""What a sender accepts, against values made to slip past it (session 29's adversarial
run): each is refused with an EncodeError naming its path before anything is written, or
arrives exactly as sent; each test here failed before its fix."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from msgspec.msgpack import Ext

import rlwire

# -- msgspec.Raw and msgspec.msgpack.Ext: written into the header unchecked -----------------

# Each was sent: a step every read refused (malformed, a code rlwire does not know), one
# read as something else (JSON text: 49), or a user's Ext read as rlwire's own (an array).
RAW_AND_EXT = {
    "raw-invalid": msgspec.Raw(b"\xc1"),
    "raw-truncated": msgspec.Raw(b"\x92\x01"),
    "raw-json-text": msgspec.Raw(b"1"),
    "raw-valid": msgspec.Raw(msgspec.msgpack.encode([1, "a"])),
    "raw-forged-ext": msgspec.Raw(b"\xd4\x01\x00"),
    "ext-unknown-code": Ext(42, b"hi"),
    "ext-buffer-code": Ext(3, msgspec.msgpack.encode([0])),
    "ext-inline-array": Ext(2, msgspec.msgpack.encode(["<f8", [1], "C", bytes(8)])),
}


class Tagged(msgspec.Struct):
    ids: list[int]
    tag: Any = None  # an annotation that may hold anything
    count: int = 0  # an annotation Python does not enforce
    raws: list[msgspec.Raw] = []  # an annotation that asks for them
    ext: Ext | None = None


def _places(bad: Any) -> list[tuple[Any, str]]:
    """``(message, path of bad in it)``: at the top, in containers, in Struct fields of
    each kind of annotation, beside out-of-band arrays, in a list stored as columns, in a
    heavy list encoded as chunks, and in a Columns."""
    ids = np.arange(2048, dtype=np.int64)  # out of band: buffer 0
    return [
        ({"v": bad, "w": 2}, "$.v"),
        ({"ids": ids, "tag": [0, (1, bad)]}, "$.tag[1][1]"),
        (Tagged([1], tag=bad), "$.tag"),
        (Tagged([1], count=bad), "$.count"),
        (Tagged([1], raws=[bad]), "$.raws[0]"),
        (Tagged([1], ext=bad), "$.ext"),
        ({"rows": [{"a": ids, "t": i if i != 3 else bad} for i in range(5)]}, "$.rows[3].t"),
        ({"xs": [{"i": i} if i != 9000 else {"i": bad} for i in range(10_000)]}, "$.xs[9000].i"),
        ({"c": rlwire.Columns({"t": [0, bad]})}, "$.c.t[1]"),
        ([Tagged(list(range(10_000)), tag=bad)], "$[0].tag"),  # a Struct chunked
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("name", sorted(RAW_AND_EXT))
async def test_raw_and_ext_values_are_refused_before_anything_is_written(
    tmp_path: Path, name: str
) -> None:
    bad = RAW_AND_EXT[name]
    kind = "msgspec.Raw" if isinstance(bad, msgspec.Raw) else "msgspec.msgpack.Ext"
    async with rlwire.open_sender(tmp_path) as sender:
        for message, path in _places(bad):
            with pytest.raises(rlwire.EncodeError) as info:
                await sender.send(message)
            assert f": {path}: {kind} values" in str(info.value), (path, str(info.value))
            assert list(tmp_path.iterdir()) == []


def test_an_ext_is_refused_saying_rlwire_reserves_extension_types(tmp_path: Path) -> None:
    with rlwire.open_sync_sender(tmp_path) as sender:
        with pytest.raises(rlwire.EncodeError, match="reserves msgpack extension types"):
            sender.send({"tag": Ext(42, b"hi")})
        sender.send({"tag": (42, b"hi")})  # what it says to send instead
    with rlwire.open_receiver(tmp_path, type=Any) as receiver:
        assert receiver.receive(timeout=5) == {"tag": [42, b"hi"]}


@pytest.mark.parametrize("codec", ["msgpack", "json"])
def test_a_raw_is_refused_by_either_codec(tmp_path: Path, codec: str) -> None:
    with rlwire.open_sync_sender(tmp_path, codec=codec) as sender:
        with pytest.raises(rlwire.EncodeError, match=r"\$\.v: .*msgspec\.Raw"):
            sender.send({"v": msgspec.Raw(b"1")})
    assert list(tmp_path.iterdir()) == []


# -- bare exceptions: a dataclass field never set, a released memoryview --------------------


@dataclasses.dataclass
class Rollout:
    reward: float
    cached: int = dataclasses.field(init=False)  # filled in later, sometimes not


@dataclasses.dataclass
class RolloutRead:
    reward: float
    cached: int = dataclasses.field(init=False, default=-1)


@pytest.mark.anyio
@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_a_dataclass_field_never_set_is_left_out_as_msgspec_does(
    tmp_path: Path, codec: str
) -> None:
    """send() raised AttributeError; msgspec and orjson write such a value without it."""
    done = Rollout(2.0)
    done.cached = 3
    async with rlwire.open_sender(tmp_path, codec=codec) as sender:
        await sender.send({"r": Rollout(1.0), "done": done, "rows": [Rollout(0.5)] * 2})
    with rlwire.open_receiver(tmp_path, type=Any) as receiver:
        got = receiver.receive(timeout=5)
    assert got == {
        "r": {"reward": 1.0},
        "done": {"reward": 2.0, "cached": 3},
        "rows": [{"reward": 0.5}] * 2,
    }
    # A typed read needs a default for it, as with msgspec itself.
    assert msgspec.convert(got["r"], RolloutRead) == RolloutRead(1.0)


def _released() -> memoryview:
    view = memoryview(b"abc")
    view.release()
    return view


@pytest.mark.anyio
@pytest.mark.parametrize("codec", ["msgpack", "json"])
async def test_a_released_memoryview_is_an_encode_error_naming_its_path(
    tmp_path: Path, codec: str
) -> None:
    """The msgpack codec raised a bare ValueError."""
    places = [({"m": _released()}, "$.m"), (Tagged([1], tag=[0, _released()]), "$.tag[1]")]
    async with rlwire.open_sender(tmp_path, codec=codec) as sender:
        for message, path in places:
            with pytest.raises(rlwire.EncodeError, match=re.escape(f"{path}: cannot encode mem")):
                await sender.send(message)
    assert list(tmp_path.iterdir()) == []


# -- numpy datetime64 and timedelta64: refused, every unit, every place ----------------------

# Nanosecond scalars, alone or as a Columns column, arrived as plain ints; other units
# were refused. All are refused now, naming the path and the dtype.
TIMES = [
    np.datetime64("2020-01-01T00:00:00.123456789", "ns"),
    np.datetime64("2020-01-01T00:00:00", "s"),
    np.datetime64("2020-01-01", "D"),
    np.datetime64("NaT", "ns"),
    np.timedelta64(5, "ns"),
    np.timedelta64(5, "D"),
]


@pytest.mark.anyio
@pytest.mark.parametrize("value", TIMES, ids=lambda v: f"{v.dtype}={v}")
async def test_datetime64_and_timedelta64_values_are_refused_with_msgpack(
    tmp_path: Path, value: np.generic
) -> None:
    ids = np.arange(3)
    places = [
        ({"t": value}, "$.t", value.dtype),
        ({"c": rlwire.Columns({"t": np.array([value, value])})}, "$.c.t[0]", value.dtype),
        ({"rows": [{"a": ids, "t": value}] * 2}, "$.rows[0].t", value.dtype),
        (Tagged([1], tag=[value]), "$.tag[0]", value.dtype),
        ({"arr": np.array([value])}, "$.arr", np.array([value]).dtype),
    ]
    async with rlwire.open_sender(tmp_path) as sender:
        for message, path, dtype in places:
            with pytest.raises(rlwire.EncodeError) as info:
                await sender.send(message)
            assert f": {path}: numpy " in str(info.value), str(info.value)
            assert f" {dtype} " in str(info.value), str(info.value)
    assert list(tmp_path.iterdir()) == []
