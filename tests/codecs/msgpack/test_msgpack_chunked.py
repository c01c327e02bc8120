"""Chunked containers: heavy lists and maps encoded as chunks in an out-of-band buffer,
a msgspec call each, and decoded a chunk per slice, straight into the receiver's types."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import numpy as np
import pytest
from depth import examples
from helpers import assert_batches_equal, make_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlwire import CorruptFrameError, DecodeError, Frame, RlwireError, TrainingBatch
from rlwire._core import slicing as _slicing
from rlwire.codecs._msgpack.codec import MsgpackCodec
from rlwire.codecs._msgpack.encode import CHUNK_WEIGHT

N = 3 * CHUNK_WEIGHT  # items in a list heavy enough to be chunked


class Routed(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    data: bytes
    shape: list[int]
    dtype: str


class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    input_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    routed: Routed | None = None
    mm: dict[str, Routed] | None = None
    note: str = ""


class ViewRouted(msgspec.Struct, array_like=True):
    data: memoryview
    shape: list[int]
    dtype: str


class ViewBatch(msgspec.Struct, array_like=True):
    input_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    routed: ViewRouted | None = None
    mm: dict[str, ViewRouted] | None = None
    note: str = ""


def micro_batch(n: int, seed: int = 0) -> MicroBatch:
    rng = np.random.default_rng(seed)
    return MicroBatch(
        input_ids=rng.integers(0, 150_000, n).tolist(),
        loss_mask=(rng.random(n) < 0.5).tolist(),
        logprobs=(-rng.exponential(size=n)).tolist(),
        routed=Routed(rng.integers(0, 256, n * 4, dtype=np.uint8).tobytes(), [n, 2, 2], "u1"),
        mm={"image": Routed(bytes(5000), [5000], "u1")},
        note=f"mb{seed}",
    )


def run_counting(sliced: Any) -> tuple[Any, int]:
    """What a sliced generator returns, and how many slices it took."""
    slices = 0
    while True:
        try:
            next(sliced)
        except StopIteration as stop:
            return stop.value, slices
        slices += 1


def encode(obj: Any, **options: Any) -> tuple[Frame, int]:
    return run_counting(MsgpackCodec(**options).encode_sliced(obj))


def decode(frame: Frame, type: Any = Any) -> tuple[Any, int]:
    return run_counting(MsgpackCodec().decode_sliced(frame, type))


def chunk_count(header: bytes | memoryview) -> int:
    """How many chunks the chunked containers of ``header`` have."""
    ranges: list[int] = []

    def ext_hook(code: int, data: memoryview) -> None:
        if code in (4, 5):
            ranges.extend(msgspec.msgpack.decode(data)[2])

    msgspec.msgpack.decode(header, ext_hook=ext_hook)
    return len(ranges) // 2


def ext_codes(header: bytes | memoryview) -> set[int]:
    codes: set[int] = set()
    msgspec.msgpack.decode(header, ext_hook=lambda code, data: codes.add(code))
    return codes


def test_framework_batches_are_chunked_and_come_back_equal() -> None:
    sent = [micro_batch(N, seed) for seed in range(3)]
    frame, _ = encode(sent, sidecar=("routed",))
    assert len(frame.header) < 2048 and 4 in ext_codes(frame.header)
    chunks = chunk_count(frame.header)
    assert chunks >= 3 * 3 * N // CHUNK_WEIGHT  # no chunk heavier than CHUNK_WEIGHT
    got, _ = decode(frame, list[MicroBatch])
    assert got == sent


def test_chunks_decode_several_to_a_slice_but_never_past_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    frame, _ = encode([micro_batch(N, seed) for seed in range(3)], sidecar=("routed",))
    chunks = chunk_count(frame.header)
    monkeypatch.setattr(_slicing, "SLICE_SECONDS", 0.0)  # every slice over at once
    assert decode(frame, list[MicroBatch])[1] >= chunks
    monkeypatch.setattr(_slicing, "SLICE_SECONDS", 60.0)  # no slice ever over
    assert decode(frame, list[MicroBatch])[1] < chunks // 2


def test_light_objects_are_not_chunked() -> None:
    frame, _ = encode([micro_batch(100, seed) for seed in range(3)])
    assert not ext_codes(frame.header) & {4, 5}


def test_received_as_plain_builtins_and_as_dicts() -> None:
    sent = {"ids": list(range(N)), "names": {f"k{i}": i for i in range(N)}, "x": 1}
    frame, _ = encode(sent)
    assert {4, 5} <= ext_codes(frame.header)
    assert decode(frame)[0] == sent
    assert decode(frame, dict[str, Any])[0] == sent


def test_memoryview_fields_are_views_and_bytes_fields_copies() -> None:
    sent = micro_batch(N)
    frame, _ = encode([sent])
    (viewed,), _ = decode(frame, list[ViewBatch])
    assert isinstance(viewed.routed.data, memoryview) and viewed.routed.data == sent.routed.data
    buffer = next(b for b in frame.buffers if b.nbytes == len(sent.routed.data))
    assert np.shares_memory(
        np.frombuffer(viewed.routed.data, np.uint8), np.frombuffer(buffer, np.uint8)
    )
    (copied,), _ = decode(frame, list[MicroBatch])
    assert type(copied.routed.data) is bytes and copied.routed.data == sent.routed.data


def test_nested_heavy_lists_are_chunked_inside_chunks() -> None:
    sent = [list(range(i, i + N)) for i in range(3)] + [[1, 2]]
    frame, _ = encode({"rows": sent})
    got, _ = decode(frame, dict[str, list[list[int]]])
    assert got == {"rows": sent}


@pytest.mark.parametrize(
    "annotation",
    [tuple[int, ...], list[int] | None, Any],
    ids=["tuple", "optional", "any"],
)
def test_shapes_the_fast_path_cannot_follow_still_decode(annotation: Any) -> None:
    cls = msgspec.defstruct("Holder", [("values", annotation)])
    sent = cls(values=tuple(range(N)) if annotation == tuple[int, ...] else list(range(N)))
    frame, _ = encode(sent)
    assert 4 in ext_codes(frame.header)
    assert decode(frame, cls)[0] == sent


def test_dicts_sent_can_be_received_into_structs() -> None:
    sent = {"input_ids": list(range(N)), "loss_mask": [True] * N, "logprobs": [0.5] * N}
    frame, _ = encode(sent)
    got, _ = decode(frame, msgspec.defstruct("Plain", [(k, list[Any]) for k in sent]))
    assert got.input_ids == sent["input_ids"] and got.logprobs == sent["logprobs"]


def test_tagged_unions_of_chunked_structs() -> None:
    class A(msgspec.Struct, tag=True):
        ids: list[int]

    class B(msgspec.Struct, tag=True):
        ids: list[int]
        extra: int = 0

    sent = [A(list(range(N))), B(list(range(N)), 3)]
    frame, _ = encode(sent)
    assert decode(frame, list[A | B])[0] == sent


def test_out_of_band_bytes_into_a_str_field_is_a_decode_error() -> None:
    frame, _ = encode({"blob": bytes(10_000), "ids": list(range(N))})
    with pytest.raises(DecodeError, match="blob"):
        decode(frame, msgspec.defstruct("Wrong", [("blob", str), ("ids", list[int])]))


def chunk_ref(frame: Frame) -> tuple[int, int, list[int]]:
    found: list[list[Any]] = []
    msgspec.msgpack.decode(
        frame.header, ext_hook=lambda code, data: found.append(msgspec.msgpack.decode(data))
    )
    index, count, ranges = found[0]
    return index, count, ranges


def with_ref(frame: Frame, index: int, count: int, ranges: list[int]) -> Frame:
    ext = msgspec.msgpack.Ext(4, msgspec.msgpack.encode([index, count, ranges]))
    return Frame(msgspec.msgpack.encode({"ids": ext}), frame.buffers)


HEAVY, _ = encode({"ids": list(range(N))})


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda i, c, r: (i, c + 1, r), f"hold {N} items, its table says {N + 1}"),
        (lambda i, c, r: (i, c, [*r, 0]), "malformed chunk table"),
        (lambda i, c, r: (i, c, [0, 1 << 40]), "outside its"),
        (lambda i, c, r: (i + 5, c, r), "refers to buffer"),
        (lambda i, c, r: (i, c, r * 40), "overlaps another chunk"),
        (lambda i, c, r: (i, c, [r[0], r[1] - 1, *r[2:]]), "header"),
    ],
    ids=["count", "odd", "outside", "buffer", "bomb", "cut"],
)
def test_bad_chunk_tables_are_corrupt_frames(change: Any, match: str) -> None:
    frame = with_ref(HEAVY, *change(*chunk_ref(HEAVY)))
    for annotation in (Any, dict[str, list[int]]):
        with pytest.raises(CorruptFrameError, match=match):
            decode(frame, annotation)


def _as_key(frame: Frame, wrap: bool) -> Frame:
    """``frame`` with its header's one extension value moved to a map's key (msgpack
    allows it; rlwire never writes it): ``{<ext>: 1}``, or with ``wrap`` ``{[[<ext>]]:
    1}`` (msgspec makes such a key a tuple)."""
    found: list[Any] = []
    msgspec.msgpack.decode(
        frame.header, ext_hook=lambda code, data: found.append(msgspec.msgpack.Ext(code, data))
    )
    (ext,) = found
    key = msgspec.msgpack.encode([[ext]] if wrap else ext)
    return Frame(b"\x81" + key + b"\x01", frame.buffers)


@pytest.mark.parametrize(
    "value",
    [
        list(range(N)),  # a chunked list
        bytes(10_000),  # out-of-band bytes
        [{"a": np.arange(3, dtype=np.int32)} for _ in range(3)],  # a columns value
    ],
    ids=["chunked", "bytes", "columns"],
)
@pytest.mark.parametrize("wrap", [False, True], ids=["key", "in-a-tuple-key"])
def test_an_extension_value_as_a_maps_key_is_a_corrupt_frame(value: Any, wrap: bool) -> None:
    """Decoded where no value goes, it would come back as the decoder's placeholder
    (an adversarial run got one inside the received dict)."""
    frame = _as_key(encode({"v": value})[0], wrap)
    for annotation in (Any, dict, dict[Any, int]):
        if annotation is Any and isinstance(value, bytes):
            continue  # a plain receive keeps out-of-band bytes as views: nothing to fill
        with pytest.raises(CorruptFrameError, match="value as a map's key"):
            decode(frame, annotation)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    flips=st.lists(
        st.tuples(st.integers(0, HEAVY.buffers[0].nbytes - 1), st.integers(1, 255)),
        min_size=1,
        max_size=4,
    )
)
def test_damaged_chunks_never_escape_the_error_hierarchy(flips: list[tuple[int, int]]) -> None:
    bulk = bytearray(HEAVY.buffers[0])
    for pos, mask in flips:
        bulk[pos] ^= mask
    frame = Frame(HEAVY.header, (memoryview(bytes(bulk)),))
    for annotation in (Any, dict[str, list[int]], dict[str, list[str]]):
        with contextlib.suppress(RlwireError):
            decode(frame, annotation)


class Plain(msgspec.Struct, array_like=True):
    """No field can hold a buffer: the codec does not walk into it on its own."""

    input_ids: list[int]
    logprobs: list[float]


class Step(msgspec.Struct):
    micro_batches: list[Plain]


def test_no_msgspec_call_gets_a_heavy_struct_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Heavy Structs inside a list the codec did not walk still have their lists chunked:
    no single encode call writes much more than a chunk's worth."""
    written: list[int] = []

    class Recording:
        inner = msgspec.msgpack.Encoder()

        def encode(self, obj: Any) -> bytes:
            out = self.inner.encode(obj)
            written.append(len(out))
            return out

    codec = MsgpackCodec()
    monkeypatch.setattr(codec, "_encoder", Recording())
    sent = Step([Plain(list(range(N)), [0.5] * N) for _ in range(4)])
    frame = codec.encode(sent)
    assert written and max(written) < 10 * CHUNK_WEIGHT  # bytes; ~3-9 per item
    assert decode(frame, Step)[0] == sent


class Blobs(msgspec.Struct):
    blobs: dict[str, bytes]
    pad: list[int]


class BlobsThenTuple(msgspec.Struct):
    items: list[Blobs]
    numbers: tuple[int, ...]  # chunked too, and a chunked tuple cannot be filled typed


def test_a_typed_fill_given_up_midway_is_redone_from_the_start() -> None:
    """The typed decode fills ``items`` (claiming each bytes value's buffer), then cannot
    fill the tuple and starts again into builtins: its claims and its half-filled lists
    are dropped, so the second fill neither refuses the buffers nor repeats items."""
    rng = np.random.default_rng(5)
    sent = BlobsThenTuple(
        [Blobs({"x": rng.bytes(5000 + i)}, list(range(100))) for i in range(200)],
        tuple(range(3 * CHUNK_WEIGHT)),
    )
    frame, _ = encode(sent)
    assert chunk_count(frame.header) >= 4  # both fields chunked, items in several chunks
    assert decode(frame, BlobsThenTuple)[0] == sent


class AnyThenTuple(msgspec.Struct):
    first: Any  # msgspec hands an Any field's list over as it is: shared with the raw data
    numbers: tuple[int, ...]


def test_a_list_filled_by_a_typed_try_is_not_filled_twice() -> None:
    sent = AnyThenTuple(list(range(3 * CHUNK_WEIGHT)), tuple(range(3 * CHUNK_WEIGHT)))
    frame, _ = encode(sent)
    assert chunk_count(frame.header) >= 6
    got = decode(frame, AnyThenTuple)[0]
    assert len(got.first) == len(sent.first)
    assert got == sent


def test_a_long_list_of_arrays_decodes_item_by_item_in_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A header whose list holds a thousand arrays (not chunked: it is light) is not
    decoded in one call: with every slice over at once, rows (about 5 KB each) are
    decoded a run of 8 KiB or so to a slice, into builtins and into a type; with slices
    that never end, a handful. (Rows of arrays as lists: lists of Structs or dicts are
    stored as columns.)"""
    batch = make_batch(256, 64, seed=3)
    sent = {"rows": [[s.token_ids, s.logprobs, s.advantages, s.mask] for s in batch.samples]}
    frame, _ = encode(sent, inline_threshold=1 << 20)
    assert not frame.buffers and len(frame.header) > 8 << 10
    monkeypatch.setattr(_slicing, "SLICE_SECONDS", 0.0)
    for type_ in (Any, dict[str, list[list[np.ndarray]]]):
        got, slices = decode(frame, type_)
        assert slices >= len(frame.header) // (16 << 10), (type_, slices)
    pairs = zip(got["rows"], sent["rows"], strict=True)
    assert all(np.array_equal(a, b) for r, s in pairs for a, b in zip(r, s, strict=True))
    monkeypatch.setattr(_slicing, "SLICE_SECONDS", 60.0)
    assert decode(frame, dict[str, list[list[np.ndarray]]])[1] < 8


def test_rows_from_columns_are_made_in_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 samples stored as columns: their rows are made a few hundred at a time
    (enough samples for several slices; 8,000 took seconds to make and compare)."""
    sent = make_batch(2000, 4, seed=3)
    frame, _ = encode(sent)
    monkeypatch.setattr(_slicing, "SLICE_SECONDS", 0.0)
    got, slices = decode(frame, TrainingBatch)
    assert slices >= 2000 // 256
    assert_batches_equal(got, sent)


def test_an_item_refused_in_a_long_list_is_named_by_its_index() -> None:
    """Converted item by item, a list still names the item that does not fit, and where
    inside it."""
    sent = [{"ids": [1, 2, 3], "name": f"s{i}", "pad": "x" * 200} for i in range(100)]
    sent[57]["ids"] = [1, "two", 3]
    frame, _ = encode(sent)

    class Item(msgspec.Struct):
        ids: list[int]
        name: str

    named = r"does not match list\[.*Item\]: .*at `\$\[57\]\.ids\[1\]`"
    with pytest.raises(DecodeError, match=named):
        decode(frame, list[Item])
