"""Users' own msgspec Structs through the msgpack codec and through every built-in sink.

RL frameworks send their batch types unchanged: msgspec Structs declared with any of
msgspec's options (``array_like``, ``omit_defaults``, ``rename``, ``tag``, ``gc=False``,
``frozen``), per-token ``list[int]`` / ``list[bool]`` / ``list[float]`` / ``list[str]``
fields, optional fields defaulting to None, and large arrays as raw ``bytes`` inside a
nested Struct (``RoutedExperts(data, shape, dtype)``), one list of micro-batches per rank.
These tests pin, through the public API only, that such types round trip equal: through
:class:`rlwire.codecs.MsgpackCodec` for types built at random with
:func:`msgspec.defstruct`, for lists long enough that a codec must split them, with the
``sidecar=`` split, with the zero-copy promises of ``memoryview`` and ``numpy.ndarray``
fields, with typed errors for bad input, and through the directory, ``memory://``, S3 and
ZeroMQ sinks.

Layout: strategies (field kinds, Struct types, their values), helpers, then one section
per concern.
"""

from __future__ import annotations

import keyword
import re
import types
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import fsspec
import msgspec
import numpy as np
import pytest
from depth import examples
from hypothesis import HealthCheck, assume, example, given, reject, settings
from hypothesis import strategies as st
from numpy.lib.array_utils import byte_bounds

import rlwire
from rlwire import DecodeError, EncodeError, Frame
from rlwire.abc import Pieces
from rlwire.codecs import MsgpackCodec

#: MsgpackCodec's documented default: bytes and arrays at least this large go out-of-band.
THRESHOLD = 4096
#: Seconds to wait for something that should happen.
TIMEOUT = 30.0
SIDECAR = ("routed_experts",)

CODEC_SETTINGS = settings(
    max_examples=examples(50),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: For the tests that look at one more property of the same random types.
SECONDARY_SETTINGS = settings(CODEC_SETTINGS, max_examples=examples(25))
SINK_SETTINGS = settings(
    max_examples=examples(3),
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        # Each example makes its own URL below the fixture's directory, bucket or prefix.
        HealthCheck.function_scoped_fixture,
    ],
)


# -- strategies: values -----------------------------------------------------------------

INTS = st.integers(-(2**63), 2**64 - 1)  # everything msgpack carries as an integer
FLOATS = st.floats(allow_nan=False, allow_infinity=False)  # NaN != NaN: equality needs finite
TEXT = st.text(max_size=12)
SEEDS = st.integers(0, 2**32 - 1)
#: Lengths of the long lists drawn beside short ones: around 64 (where a codec may cut a
#: list into groups), a few hundred, thousands, and tens of thousands (more items than a
#: codec may hand msgspec in one call, so it must split them).
LONG_LENGTHS = st.one_of(
    st.integers(60, 70),
    st.integers(9, 1_000),
    st.integers(9, 20_000),
    st.integers(30_000, 80_000),
)
#: The same for lists of Structs, which cost far more per item.
LONG_STRUCT_LENGTHS = st.one_of(st.integers(60, 70), st.integers(9, 300))
#: The most items (scalars and containers, each occurrence of a shared one counted) an
#: example may hold, so that nested long lists of Structs stay quick to encode.
BUDGET = 400_000
VOCABULARY = ["", "a", "tool_call", "héllo wörld", "日本語", "🦀🦀", "x" * 40, "\x00"]

Bulk = Callable[[np.random.Generator, int], list[Any]]
#: Types of the values msgspec writes as they are: lists of them need no walking.
SCALARS = frozenset([int, float, bool, str, type(None)])


def list_type(item: Any) -> Any:
    """``list[item]`` for an item type made at run time."""
    return types.GenericAlias(list, (item,))


def dict_type(value: Any) -> Any:
    """``dict[str, value]`` for a value type made at run time."""
    return types.GenericAlias(dict, (str, value))


def bulk_ints(rng: np.random.Generator, n: int) -> list[Any]:
    if rng.random() < 0.5:
        return list(rng.integers(0, 200_000, n).tolist())  # token ids
    return list(rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True).tolist())


def bulk_floats(rng: np.random.Generator, n: int) -> list[Any]:
    values = rng.standard_normal(n) * 10.0 ** float(rng.integers(-30, 30))
    if rng.random() < 0.5:
        values = values.astype(np.float32).astype(np.float64)  # logprobs from float32
    return list(values.tolist())


def bulk_bools(rng: np.random.Generator, n: int) -> list[Any]:
    return list((rng.random(n) < 0.7).tolist())


def bulk_text(rng: np.random.Generator, n: int) -> list[Any]:
    return [VOCABULARY[i] for i in rng.integers(0, len(VOCABULARY), n)]


def bulk_nested_ints(rng: np.random.Generator, n: int) -> list[Any]:
    """Short inner lists; or, half the time, skewed: empty at the first, middle and last
    place (where a codec might sample sizes) and up to 60 items elsewhere."""
    sizes = rng.integers(0, 6, n)
    if rng.random() < 0.5:
        sizes = rng.integers(0, 60, n)
        sizes[[0, n // 2, -1] if n else []] = 0
    return [rng.integers(0, 1_000, k).tolist() for k in sizes]


def bulk_int_dicts(rng: np.random.Generator, n: int) -> dict[str, Any]:
    return dict(zip((f"k{i}" for i in range(n)), bulk_ints(rng, n), strict=True))


@st.composite
def _long_lists(
    draw: st.DrawFn,
    elements: st.SearchStrategy[Any],
    bulk: Bulk | None,
    long_lengths: st.SearchStrategy[int],
) -> list[Any]:
    head = draw(st.lists(elements, min_size=1, max_size=4))
    n = max(draw(long_lengths), len(head))
    if bulk is None:
        return [head[i % len(head)] for i in range(n)]
    return head + bulk(np.random.default_rng(draw(SEEDS)), n - len(head))


def lists_of(
    elements: st.SearchStrategy[Any],
    bulk: Bulk | None = None,
    long_lengths: st.SearchStrategy[int] = LONG_LENGTHS,
) -> st.SearchStrategy[list[Any]]:
    """Short lists drawn item by item, or long ones: a few drawn items (edge values) then
    ``bulk`` items from a seeded generator, or the drawn items repeated when there is no
    ``bulk`` (so one object may appear many times in a message)."""
    return st.one_of(st.lists(elements, max_size=8), _long_lists(elements, bulk, long_lengths))


@st.composite
def dicts_of(
    draw: st.DrawFn,
    values: st.SearchStrategy[Any],
    bulk: Callable[[np.random.Generator, int], dict[str, Any]],
) -> dict[str, Any]:
    """Small dicts drawn entry by entry, or large ones from a seeded generator."""
    small = draw(st.dictionaries(TEXT, values, max_size=6))
    if draw(st.booleans()):
        return small
    return {**bulk(np.random.default_rng(draw(SEEDS)), draw(LONG_LENGTHS)), **small}


def blob(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(size)


#: Sizes of bytes values: small (inline), around the threshold, and out-of-band.
BLOB_SIZES = st.one_of(
    st.integers(0, 64),
    st.integers(THRESHOLD - 2, THRESHOLD + 2),
    st.integers(THRESHOLD, 40_000),
)
BLOBS = st.builds(blob, BLOB_SIZES, SEEDS)
ARRAY_DTYPES = ["|u1", "<u2", "<i4", "<i8", ">i8", "<f4", "<f8", "|b1"]


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    """Small (inline) or large (out-of-band) arrays, in C or Fortran order."""
    dtype = np.dtype(draw(st.sampled_from(ARRAY_DTYPES)))
    rows = draw(st.one_of(st.integers(0, 8), st.integers(300, 3_000)))
    shape = [rows, *draw(st.lists(st.integers(1, 6), max_size=2))]
    rng = np.random.default_rng(draw(SEEDS))
    if dtype.kind == "b":
        arr = rng.random(shape) < 0.5
    elif dtype.kind == "f":
        arr = rng.standard_normal(shape).astype(dtype)
    else:
        arr = rng.integers(0, 250, shape).astype(dtype)
    return np.asfortranarray(arr) if draw(st.booleans()) else arr


# -- strategies: Struct types -------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """A field type a user might declare and the values that go in it.

    ``default`` is what the field holds when it is given a default (``NODEFAULT``: the
    kind never gets one); ``has_array`` says whether values may hold numpy arrays, which
    ``==`` cannot compare inside a Struct.
    """

    annotation: Any
    values: st.SearchStrategy[Any]
    default: Any = msgspec.NODEFAULT
    has_array: bool = False

    def optional(self) -> Kind:
        return Kind(self.annotation | None, st.none() | self.values, None, self.has_array)

    def defaulted(self) -> Kind:
        return Kind(
            self.annotation, st.just(self.default) | self.values, self.default, self.has_array
        )


def heft(value: Any, seen: dict[int, int] | None = None) -> int:
    """The items in ``value``, counting every occurrence of a shared container (a codec
    writes each one), computing each container's count once."""
    seen = {} if seen is None else seen
    if isinstance(value, msgspec.Struct):
        items: Iterable[Any] = (getattr(value, name) for name in value.__struct_fields__)
    elif type(value) is dict:
        items = value.values()
    elif type(value) in (list, tuple):
        items = value
    else:
        return 1
    known = seen.get(id(value))
    if known is None:
        known = seen[id(value)] = 1 + sum(
            1 if type(item) in SCALARS else heft(item, seen) for item in items
        )
    return known


@dataclass(frozen=True)
class UserType:
    """A Struct type made with msgspec.defstruct and a strategy for its instances."""

    cls: type[msgspec.Struct]
    values: st.SearchStrategy[Any]
    has_array: bool


def base_kinds(long_lengths: st.SearchStrategy[int]) -> list[Kind]:
    """Every field kind that holds no user Struct, with list lengths up to ``long_lengths``."""

    def seq(elements: st.SearchStrategy[Any], bulk: Bulk) -> st.SearchStrategy[list[Any]]:
        return lists_of(elements, bulk, long_lengths)

    return [
        Kind(int, INTS, 0),
        Kind(float, FLOATS, 0.0),
        Kind(bool, st.booleans(), False),
        Kind(str, TEXT, ""),
        Kind(list[int], seq(INTS, bulk_ints), []),
        Kind(list[bool], seq(st.booleans(), bulk_bools), []),
        Kind(list[float], seq(FLOATS, bulk_floats), []),
        Kind(list[str], seq(TEXT, bulk_text), []),
        Kind(list[list[int]], seq(st.lists(INTS, max_size=5), bulk_nested_ints), []),
        Kind(dict[str, int], dicts_of(INTS, bulk_int_dicts), {}),
        Kind(tuple[int, ...], seq(INTS, bulk_ints).map(tuple), ()),
        Kind(tuple[str, float, bool], st.tuples(TEXT, FLOATS, st.booleans())),
        Kind(bytes, BLOBS, b""),
        Kind(memoryview, BLOBS.map(memoryview)),
        Kind(bytearray, BLOBS.map(bytearray)),
        Kind(np.ndarray, arrays(), has_array=True),
        Kind(list[bytes], st.lists(BLOBS, max_size=4), []),
        Kind(dict[str, bytes], st.dictionaries(TEXT, BLOBS, max_size=3), {}),
    ]


#: Kinds of top-level fields, and of fields of Structs nested in them (shorter lists, as
#: those Structs may be repeated hundreds of times in a list).
OUTER_KINDS = base_kinds(LONG_LENGTHS)
INNER_KINDS = base_kinds(st.one_of(st.integers(60, 70), st.integers(9, 500)))


def nested_kinds(inner: UserType) -> list[Kind]:
    """Fields holding Structs of another user type: alone, in a list, in a dict."""
    cls, values, arr = inner.cls, inner.values, inner.has_array
    return [
        Kind(cls, values, has_array=arr),
        Kind(list_type(cls), lists_of(values, None, LONG_STRUCT_LENGTHS), [], arr),
        Kind(dict_type(cls), st.dictionaries(TEXT, values, max_size=4), {}, arr),
    ]


FIELD_NAMES = st.from_regex(r"[a-z][a-z0-9]{0,6}(_[a-z][a-z0-9]{0,5}){0,2}", fullmatch=True).filter(
    lambda name: not keyword.iskeyword(name)
)
CLASS_NAMES = st.from_regex(r"[A-Z][A-Za-z0-9]{0,10}", fullmatch=True)
TAG_FIELDS = st.sampled_from(["type", "kind", "$tag"])
#: Names a field may be renamed to: msgspec refuses empty ones, quotes, backslashes and
#: control characters.
RENAMED = st.text(
    st.characters(exclude_categories=["Cc", "Cs"], exclude_characters='\\"'),
    min_size=1,
    max_size=10,
)


@st.composite
def struct_options(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    """Random msgspec Struct options for a type whose fields are ``names``."""
    options: dict[str, Any] = {
        "array_like": draw(st.booleans()),
        "omit_defaults": draw(st.booleans()),
        "gc": draw(st.booleans()),
        "frozen": draw(st.booleans()),
    }
    rename = draw(st.sampled_from([None, "camel", "kebab", "pascal", "mapping"]))
    if rename == "mapping":
        chosen = draw(st.lists(st.sampled_from(names), unique=True))
        new = draw(st.lists(RENAMED, min_size=len(chosen), max_size=len(chosen), unique=True))
        options["rename"] = dict(zip(chosen, new, strict=True))
    elif rename is not None:
        options["rename"] = rename
    tag = draw(st.one_of(st.none(), st.just(True), TEXT, st.integers(-(2**63), 2**63 - 1)))
    if tag is not None:
        options["tag"] = tag
        tag_field = draw(st.none() | TAG_FIELDS)
        if tag_field is not None:
            options["tag_field"] = tag_field
    return options


def defstruct(name: str, fields: list[Any], options: dict[str, Any]) -> Any:
    """msgspec.defstruct, rejecting the example when msgspec refuses the options (two
    fields renamed alike, a field clashing with the tag field)."""
    try:
        return msgspec.defstruct(name, fields, **options)
    except (ValueError, TypeError):
        reject()


def make_struct(name: str, fields: dict[str, Kind], options: dict[str, Any]) -> UserType:
    """defstruct a type (fields with defaults last, as msgspec requires)."""
    required = [(n, k.annotation) for n, k in fields.items() if k.default is msgspec.NODEFAULT]
    defaulted = [
        (n, k.annotation, k.default)
        for n, k in fields.items()
        if k.default is not msgspec.NODEFAULT
    ]
    cls = defstruct(name, [*required, *defaulted], options)
    values = st.fixed_dictionaries({n: k.values for n, k in fields.items()}).map(
        lambda kwargs: cls(**kwargs)
    )
    return UserType(cls, values, any(k.has_array for k in fields.values()))


@st.composite
def user_types(draw: st.DrawFn, depth: int = 2, options: dict[str, Any] | None = None) -> UserType:
    """A Struct type with random options and 1-6 fields of random kinds: required, with
    a default, or optional (``T | None = None``); below ``depth`` > 0 fields may hold
    Structs of another random type."""
    kinds = list(OUTER_KINDS if depth > 1 else INNER_KINDS)
    if depth > 0:
        kinds += nested_kinds(draw(user_types(depth - 1)))
    names = draw(st.lists(FIELD_NAMES, min_size=1, max_size=6, unique=True))
    fields = {}
    for name in names:
        kind = draw(st.sampled_from(kinds))
        how = draw(st.sampled_from(["required", "default", "optional"]))
        if how == "optional":
            kind = kind.optional()
        elif how == "default" and kind.default is not msgspec.NODEFAULT:
            kind = kind.defaulted()
        else:
            kind = Kind(kind.annotation, kind.values, has_array=kind.has_array)
        fields[name] = kind
    chosen = draw(struct_options(names))
    chosen.update(options or {})
    return make_struct(draw(CLASS_NAMES), fields, chosen)


@st.composite
def user_values(draw: st.DrawFn, depth: int = 2) -> tuple[UserType, Any]:
    """A user type and an instance of it (within :data:`BUDGET`)."""
    user = draw(user_types(depth))
    value = draw(user.values)
    assume(heft(value) <= BUDGET)
    return user, value


# -- strategies: framework-shaped micro-batches -------------------------------------------


@dataclass(frozen=True)
class Framework:
    """An RL framework's batch types: ``RoutedExperts(data: bytes, shape, dtype)`` and a
    ``MicroBatch`` of per-token lists, whose ``routed_experts`` is either one
    RoutedExperts or a ``dict[str, RoutedExperts]``."""

    micro_batch: type[msgspec.Struct]
    routed: type[msgspec.Struct]
    routed_as_dict: bool


def framework(routed_options: dict[str, Any], options: dict[str, Any], as_dict: bool) -> Framework:
    routed = defstruct(
        "RoutedExperts", [("data", bytes), ("shape", list[int]), ("dtype", str)], routed_options
    )
    routed_type = dict_type(routed) if as_dict else routed
    micro_batch = defstruct(
        "MicroBatch",
        [
            ("input_ids", list[int]),
            ("loss_mask", list[bool]),
            ("advantages", list[float]),
            ("inference_logprobs", list[float]),
            ("position_ids", list[int]),
            ("temperatures", list[float]),
            ("env_names", list[str]),
            ("routed_experts", routed_type | None, None),
            ("mm_tensors", dict_type(routed) | None, None),
            ("lora_num_tokens", list[int] | None, None),
            ("teacher_logprobs", list[float] | None, None),
        ],
        options,
    )
    return Framework(micro_batch, routed, as_dict)


#: What frameworks declare today.
TYPICAL = framework(
    {"array_like": True, "gc": False},
    {"array_like": True, "gc": False, "omit_defaults": True},
    as_dict=False,
)

_FRAMEWORK_FIELDS = [
    "input_ids",
    "loss_mask",
    "advantages",
    "inference_logprobs",
    "position_ids",
    "temperatures",
    "env_names",
    "routed_experts",
    "mm_tensors",
    "lora_num_tokens",
    "teacher_logprobs",
]


@st.composite
def frameworks(draw: st.DrawFn) -> Framework:
    """Framework types with random Struct options (tags and renames included)."""
    return framework(
        draw(struct_options(["data", "shape", "dtype"])),
        draw(struct_options(_FRAMEWORK_FIELDS)),
        draw(st.booleans()),
    )


def routed_experts(fw: Framework, rng: np.random.Generator, tokens: int) -> msgspec.Struct:
    """``[tokens, layers, topk]`` expert ids as raw uint8 or uint16 bytes, as frameworks send."""
    dtype = np.dtype(rng.choice(["uint8", "uint16"]))
    shape = [tokens, int(rng.integers(1, 5)), int(rng.integers(1, 9))]
    data = rng.integers(0, 64, shape).astype(dtype).tobytes()
    return fw.routed(data=data, shape=shape, dtype=dtype.name)


def micro_batch(
    fw: Framework, tokens: int, seed: int, *, routed: bool, images: int, extras: bool
) -> msgspec.Struct:
    rng = np.random.default_rng(seed)
    routed_value: Any = None
    if routed:
        routed_value = routed_experts(fw, rng, tokens)
        if fw.routed_as_dict:
            routed_value = {"layer_block_0": routed_value, "mtp": routed_experts(fw, rng, tokens)}
    mm = {f"image_{i}": routed_experts(fw, rng, int(rng.integers(1, 600))) for i in range(images)}
    return fw.micro_batch(
        input_ids=rng.integers(0, 150_000, tokens).tolist(),
        loss_mask=(rng.random(tokens) < 0.8).tolist(),
        advantages=rng.standard_normal(tokens).tolist(),
        inference_logprobs=(-rng.exponential(size=tokens)).astype(np.float32).tolist(),
        position_ids=list(range(tokens)),
        temperatures=[1.0] * tokens,
        env_names=bulk_text(rng, tokens // 100 + 1),
        routed_experts=routed_value,
        mm_tensors=mm or None,
        lora_num_tokens=[tokens] if extras else None,
        teacher_logprobs=rng.standard_normal(tokens).tolist() if extras else None,
    )


@st.composite
def micro_batches(draw: st.DrawFn, fw: Framework, max_count: int = 4) -> list[Any]:
    """One rank's payload: a list of micro-batches of 0 to a few thousand tokens."""
    count = draw(st.integers(0, max_count))
    return [
        micro_batch(
            fw,
            draw(st.one_of(st.integers(0, 8), st.integers(0, 300), st.integers(0, 3_000))),
            draw(SEEDS),
            routed=draw(st.booleans()),
            images=draw(st.integers(0, 2)),
            extras=draw(st.booleans()),
        )
        for _ in range(count)
    ]


@st.composite
def framework_steps(draw: st.DrawFn) -> tuple[Framework, list[list[Any]]]:
    """Framework types and one step: a list of micro-batches for each of 1-3 ranks."""
    fw = draw(frameworks())
    ranks = draw(st.integers(1, 3))
    return fw, [draw(micro_batches(fw, max_count=3)) for _ in range(ranks)]


# -- helpers ------------------------------------------------------------------------------


def assert_same(got: Any, want: Any, path: str = "$") -> None:
    """Deep equality that also compares numpy arrays (dtype, shape, values) and
    memoryviews (by content), and checks types, with the path of the first difference."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{path}: {type(got).__name__}, not an ndarray"
        assert (got.dtype.str, got.shape) == (want.dtype.str, want.shape), path
        assert np.array_equal(got, want), path
    elif isinstance(want, memoryview):
        assert isinstance(got, memoryview), f"{path}: {type(got).__name__}, not a memoryview"
        assert got.tobytes() == want.tobytes(), path
    elif isinstance(want, msgspec.Struct):
        assert type(got) is type(want), f"{path}: {type(got).__name__}"
        for name in want.__struct_fields__:
            assert_same(getattr(got, name), getattr(want, name), f"{path}.{name}")
    elif isinstance(want, dict):
        assert type(got) is dict, f"{path}: {type(got).__name__}, not a dict"
        assert got.keys() == want.keys(), path
        for key, item in want.items():
            assert_same(got[key], item, f"{path}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert type(got) is type(want), f"{path}: {type(got).__name__}, not {type(want).__name__}"
        assert len(got) == len(want), f"{path}: length {len(got)}, not {len(want)}"
        if all(type(item) in SCALARS for item in want):  # fast path for long lists
            assert list(map(type, got)) == list(map(type, want)), path
            assert got == want, path
        else:
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_same(g, w, f"{path}[{i}]")
    else:
        assert type(got) is type(want), f"{path}: {type(got).__name__}, not {type(want).__name__}"
        assert got == want, path


def received(frame: Frame) -> Frame:
    """``frame`` as a receiver sees it: copied bytes, read-only, nothing shared with the
    sent objects."""
    return Frame(
        bytes(frame.header),
        tuple(memoryview(bytes(b)) for b in frame.views()),
        frame.sidecar,
        frame.codec,
    )


def controlled(frame: Frame) -> tuple[Frame, list[bytearray]]:
    """``frame`` received into bytearrays the test owns and can change afterwards."""
    buffers = [bytearray(b) for b in frame.views()]
    return (
        Frame(
            bytes(frame.header),
            tuple(memoryview(b) for b in buffers),
            frame.sidecar,
            frame.codec,
        ),
        buffers,
    )


def invert(buffers: list[bytearray]) -> None:
    """Flip every bit of every buffer, in place."""
    for buffer in buffers:
        view = np.frombuffer(buffer, np.uint8)
        np.bitwise_not(view, out=view)


def flipped(got: memoryview | np.ndarray, sent: memoryview | np.ndarray) -> bool:
    """Whether ``got`` holds ``sent``'s bytes with every bit flipped (see :func:`invert`)."""
    flat = np.frombuffer(got.tobytes(), np.uint8)
    return bool(np.array_equal(flat, ~np.frombuffer(sent.tobytes(), np.uint8)))


def spans(buffers: Iterable[bytearray | memoryview | Pieces]) -> list[tuple[int, int]]:
    """The first and past-the-last address of each of ``buffers`` (of each run of a
    :class:`~rlwire.abc.Pieces`: a column of many values' memory)."""
    runs = (b.runs if isinstance(b, Pieces) else (b,) for b in buffers)
    views = [np.frombuffer(run, np.uint8) for some in runs for run in some]
    return [(view.ctypes.data, view.ctypes.data + view.nbytes) for view in views]


def within(
    value: bytes | bytearray | memoryview | np.ndarray, memory: list[tuple[int, int]]
) -> bool:
    """Whether ``value``'s memory lies in one of the address ranges ``memory`` (from
    :func:`spans`). By bounds: ``np.shares_memory``'s exact answer, over the hundreds of
    leaves and buffers of a long list, outlasted the test's timeout."""
    arr = value if isinstance(value, np.ndarray) else np.frombuffer(value, np.uint8)
    low, high = byte_bounds(arr)
    return any(start <= low and high <= end for start, end in memory)


def leaves(got: Any, want: Any) -> Iterator[tuple[Any, Any]]:
    """Pairs of (decoded, sent) bytes-like and ndarray values, walking both alike."""
    if isinstance(want, bytes | bytearray | memoryview | np.ndarray):
        yield got, want
    elif isinstance(want, msgspec.Struct):
        for name in want.__struct_fields__:
            yield from leaves(getattr(got, name), getattr(want, name))
    elif isinstance(want, dict):
        for key, item in want.items():
            yield from leaves(got[key], item)
    elif isinstance(want, list | tuple) and not all(type(x) in SCALARS for x in want):
        for g, w in zip(got, want, strict=True):
            yield from leaves(g, w)


def nbytes(value: bytes | bytearray | memoryview | np.ndarray) -> int:
    return value.nbytes if isinstance(value, memoryview | np.ndarray) else len(value)


def plain(value: Any) -> Any:
    """Builtins with bytes-likes as bytes, tuples as lists and arrays as a marker list."""
    if isinstance(value, np.ndarray):
        return ["ndarray", value.dtype.str, list(value.shape), value.tobytes()]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        if all(type(item) in SCALARS for item in value):
            return list(value)
        return [plain(item) for item in value]
    return value


def to_builtins(obj: Any) -> Any:
    """What msgspec itself makes of ``obj`` as plain data (Struct options applied)."""
    return plain(
        msgspec.to_builtins(
            obj,
            builtin_types=(bytes, bytearray, memoryview),
            enc_hook=lambda arr: ["ndarray", arr.dtype.str, list(arr.shape), arr.tobytes()],
        )
    )


def round_trip(value: Any, type: Any, codec: MsgpackCodec | None = None) -> Any:
    codec = codec or MsgpackCodec()
    return codec.decode(received(codec.encode(value)), type=type)


# -- codec round trips over random user types ---------------------------------------------


@CODEC_SETTINGS
@given(user_values())
def test_user_structs_round_trip_equal(case: tuple[UserType, Any]) -> None:
    user, value = case
    got = round_trip(value, user.cls)
    assert_same(got, value)
    if not user.has_array:
        assert got == value


@SECONDARY_SETTINGS
@given(st.data())
def test_lists_dicts_and_optionals_of_user_structs_round_trip(data: st.DataObject) -> None:
    user = data.draw(user_types(depth=1))
    values = data.draw(lists_of(user.values, None, LONG_STRUCT_LENGTHS))
    by_name = data.draw(st.dictionaries(TEXT, user.values, max_size=4))
    assume(heft([values, by_name]) <= BUDGET)
    assert_same(round_trip(values, list_type(user.cls)), values)
    assert_same(round_trip(by_name, dict_type(user.cls)), by_name)
    assert round_trip(None, user.cls | None) is None


class Pick(msgspec.Struct, tag="pick", gc=False):
    data: bytes
    ids: list[int]


class Skip(msgspec.Struct, tag="skip", gc=False):
    n: int
    ids: list[int] = []


@st.composite
def tagged_unions(draw: st.DrawFn) -> tuple[Any, list[Any]]:
    """Two user types that msgspec accepts in one union (tags of one kind, one tag field,
    both array-like or neither), and a list of instances of either."""
    tag_kind = draw(st.sampled_from([TEXT, st.integers(-(2**63), 2**63 - 1)]))
    tags = draw(st.lists(tag_kind, min_size=2, max_size=2, unique=True))
    shared = {"array_like": draw(st.booleans()), "tag_field": draw(TAG_FIELDS)}
    first = draw(user_types(depth=1, options={**shared, "tag": tags[0]}))
    second = draw(user_types(depth=1, options={**shared, "tag": tags[1]}))
    values = draw(lists_of(first.values | second.values, None, LONG_STRUCT_LENGTHS))
    assume(heft(values) <= BUDGET)
    return first.cls | second.cls, values


@SECONDARY_SETTINGS
@example(case=(Pick | Skip, [Pick(blob(THRESHOLD, 0), [1]), Skip(2)]))
@given(case=tagged_unions())
def test_tagged_unions_of_user_structs_round_trip(case: tuple[Any, list[Any]]) -> None:
    union, values = case
    got = round_trip(values, list_type(union))
    assert_same(got, values)


UNION_BYTES = {
    "member": (Pick(blob(THRESHOLD, 1), [1, 2]), Pick | Skip),
    "list-of-members": ([Skip(1), Pick(blob(50_000, 2), [])], list[Pick | Skip]),
    "dict-of-members": ({"a": Pick(blob(THRESHOLD * 3, 3), [7])}, dict[str, Pick | Skip]),
}


@pytest.mark.parametrize(("value", "type"), UNION_BYTES.values(), ids=UNION_BYTES.keys())
def test_bytes_fields_of_tagged_union_members_get_bytes(value: Any, type: Any) -> None:
    assert_same(round_trip(value, type), value)


def test_heavy_lists_in_tagged_union_members_round_trip() -> None:
    values = [
        Pick(b"small", list(range(100_000))),
        Skip(3, bulk_ints(np.random.default_rng(0), 200_000)),
        Pick(b"", []),
    ] * 3
    assert round_trip(values, list[Pick | Skip]) == values


@pytest.mark.parametrize(
    ("value", "type"),
    [
        (blob(THRESHOLD, 4), bytes),
        (memoryview(blob(THRESHOLD * 2, 5)), memoryview),
        (blob(THRESHOLD * 4, 6), bytes | None),
    ],
    ids=["bytes", "memoryview", "optional-bytes"],
)
def test_out_of_band_bytes_at_the_top_level_round_trip(value: Any, type: Any) -> None:
    assert_same(round_trip(value, type), value)


@SECONDARY_SETTINGS
@given(user_values())
def test_untyped_decode_gives_what_msgspec_makes_of_the_struct(case: tuple[UserType, Any]) -> None:
    _, value = case
    got = round_trip(value, Any)
    assert plain(got) == to_builtins(value)


@SECONDARY_SETTINGS
@given(user_values())
def test_large_buffers_travel_out_of_band_uncopied(case: tuple[UserType, Any]) -> None:
    """Every bytes, memoryview or array value of at least the threshold is one of the
    frame's buffers, sharing the sent object's memory."""
    _, value = case
    frame = MsgpackCodec().encode(value)
    large = [want for _, want in leaves(value, value) if nbytes(want) >= THRESHOLD]
    sent = spans(frame.buffers)
    for want in large:
        assert within(want, sent), f"a {type(want).__name__} of {nbytes(want)} bytes was copied"


# -- long lists, which a codec must split --------------------------------------------------

#: Struct options for the long lists (the hypothesis tests above draw every other mix).
OPTION_SETS = {
    "framework": {"array_like": True, "gc": False, "omit_defaults": True},
    "renamed-tagged-frozen": {"rename": "camel", "tag": "long", "tag_field": "$t", "frozen": True},
}


def long_types(options: dict[str, Any]) -> tuple[type[msgspec.Struct], type[msgspec.Struct]]:
    small = msgspec.defstruct(
        "SmallSample",
        [("token_id", int), ("logprob", float), ("stop", bool), ("text", str), ("raw", bytes)],
        **options,
    )
    long = msgspec.defstruct(
        "LongBatch",
        [
            ("input_ids", list[int]),
            ("advantages", list[float]),
            ("loss_mask", list[bool]),
            ("env_names", list[str]),
            ("turns", list[list[int]]),
            ("samples", list_type(small)),
            ("position_ids", tuple[int, ...]),
            ("by_env", dict[str, list[float]]),
            ("teacher_logprobs", list[float] | None, None),
        ],
        **options,
    )
    return small, long


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
def test_long_lists_round_trip(options: dict[str, Any]) -> None:
    """300,000-item number lists, 100,000 strings, 20,000 inner lists and 5,000 Structs."""
    small, long = long_types(options)
    rng = np.random.default_rng(12)
    n = 300_000
    value = long(
        input_ids=bulk_ints(rng, n),
        advantages=bulk_floats(rng, n),
        loss_mask=bulk_bools(rng, n),
        env_names=bulk_text(rng, 100_000),
        turns=bulk_nested_ints(rng, 20_000),
        samples=[
            small(i, float(i) / 7, i % 3 == 0, VOCABULARY[i % 8], blob(i % 50, i))
            for i in range(5_000)
        ],
        position_ids=tuple(range(n)),
        by_env={"math": bulk_floats(rng, 70_000), "code": []},
    )
    got = round_trip(value, long)
    assert got == value
    assert_same(got, value)


@pytest.mark.parametrize(
    ("value", "type"),
    [
        (list(range(-150_000, 150_000)), list[int]),
        ([i / 3 for i in range(300_000)], list[float]),
        ({"ids": list(range(300_000)), "mask": [True, False] * 150_000}, dict[str, list[Any]]),
        ([(i, -i, 2**63 + i) for i in range(100_000)], list[tuple[int, int, int]]),
    ],
    ids=["ints", "floats", "dict-of-lists", "tuples"],
)
def test_long_plain_containers_round_trip(value: Any, type: Any) -> None:
    assert round_trip(value, type) == value


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
def test_untyped_decode_of_long_lists_gives_what_msgspec_makes(options: dict[str, Any]) -> None:
    small, long = long_types(options)
    rng = np.random.default_rng(5)
    value = long(
        input_ids=bulk_ints(rng, 300_000),
        advantages=bulk_floats(rng, 300_001),
        loss_mask=bulk_bools(rng, 65),
        env_names=bulk_text(rng, 64),
        turns=bulk_nested_ints(rng, 63),
        samples=[small(i, 0.5, True, "", b"") for i in range(5_000)],
        position_ids=(),
        by_env={},
    )
    got = round_trip(value, Any)
    assert plain(got) == to_builtins(value)


# -- the sidecar split ---------------------------------------------------------------------


def routed_bytes(fw: Framework, batches: list[Any]) -> tuple[list[bytes], list[bytes]]:
    """The ``data`` of every RoutedExperts in ``routed_experts`` fields, and of those
    elsewhere (``mm_tensors``)."""
    named: list[bytes] = []
    other: list[bytes] = []
    for mb in batches:
        routed = mb.routed_experts
        if routed is not None:
            named += [r.data for r in routed.values()] if fw.routed_as_dict else [routed.data]
        other += [r.data for r in (mb.mm_tensors or {}).values()]
    return named, other


@CODEC_SETTINGS
@given(st.data())
def test_sidecar_holds_the_routed_experts_bytes_and_nothing_else(data: st.DataObject) -> None:
    fw = data.draw(frameworks())
    batches = data.draw(micro_batches(fw))
    frame = MsgpackCodec(sidecar=SIDECAR).encode(batches)
    named, other = routed_bytes(fw, batches)
    side = [bytes(frame.buffers[i]) for i in sorted(frame.sidecar)]
    rest = [bytes(b) for i, b in enumerate(frame.buffers) if i not in frame.sidecar]
    # Every routed-experts blob, however small, is in the sidecar. (Whether an empty one
    # is a sidecar buffer of 0 bytes or stays in the header is the codec's choice.)
    assert sorted(b for b in side if b) == sorted(b for b in named if b)
    assert all(b in named for b in side)
    # Nothing else is: other large bytes go out-of-band beside the header, not to the
    # sidecar (the codec may add buffers of its own there too).
    for payload in other:
        if len(payload) >= THRESHOLD:
            assert payload in rest
            rest.remove(payload)
    got = MsgpackCodec(sidecar=SIDECAR).decode(received(frame), list_type(fw.micro_batch))
    assert_same(got, batches)


def test_sidecar_of_typical_framework_types() -> None:
    batches = [
        micro_batch(TYPICAL, tokens, seed, routed=True, images=1, extras=True)
        for seed, tokens in enumerate([1, 17, 2_000])
    ]
    frame = MsgpackCodec(sidecar=SIDECAR).encode(batches)
    named, _ = routed_bytes(TYPICAL, batches)
    assert len(frame.sidecar) == 3
    assert [bytes(frame.buffers[i]) for i in sorted(frame.sidecar)] == named
    plain_frame = MsgpackCodec().encode(batches)
    assert not plain_frame.sidecar


# -- zero copy on receive ------------------------------------------------------------------


class Blob(msgspec.Struct, array_like=True, gc=False):
    view: memoryview
    array: np.ndarray
    raw: bytes


class Holder(msgspec.Struct, omit_defaults=True):
    view: memoryview
    array: np.ndarray
    raw: bytes
    blobs: list[Blob]
    by_name: dict[str, Blob]
    maybe_view: memoryview | None = None
    maybe_array: np.ndarray | None = None


def holder() -> Holder:
    rng = np.random.default_rng(3)

    def one(i: int) -> Blob:
        return Blob(
            memoryview(blob(THRESHOLD + i, i)),
            rng.integers(0, 9, (700 + i, 3), dtype=np.int32),
            blob(THRESHOLD * 2 + i, 100 + i),
        )

    return Holder(
        view=memoryview(blob(50_000, 1)),
        array=np.asfortranarray(rng.standard_normal((100, 80))),
        raw=blob(20_000, 2),
        blobs=[one(i) for i in range(3)],
        by_name={"a": one(10), "b": one(11)},
        maybe_view=memoryview(blob(THRESHOLD, 4)),
        maybe_array=rng.integers(0, 2**16, 5_000, dtype=np.uint16),
    )


def decoded_holder() -> tuple[Holder, Holder, list[bytearray]]:
    want = holder()
    frame, buffers = controlled(MsgpackCodec().encode(want))
    got = MsgpackCodec().decode(frame, type=Holder)
    assert_same(got, want)
    return got, want, buffers


def test_memoryview_fields_are_views_over_the_received_buffers() -> None:
    got, want, buffers = decoded_holder()
    views = [(g, w) for g, w in leaves(got, want) if isinstance(w, memoryview)]
    assert len(views) == 7
    received = spans(buffers)
    for g, _ in views:
        assert within(g, received)
    invert(buffers)
    for g, w in views:
        assert flipped(g, w)


def test_ndarray_fields_are_views_over_the_received_buffers() -> None:
    got, want, buffers = decoded_holder()
    arrays_ = [(g, w) for g, w in leaves(got, want) if isinstance(w, np.ndarray)]
    assert len(arrays_) == 7
    received = spans(buffers)
    for g, _ in arrays_:
        assert within(g, received)
    invert(buffers)
    for g, w in arrays_:
        assert flipped(g, w)


def test_bytes_fields_get_their_own_bytes() -> None:
    got, want, buffers = decoded_holder()
    raws = [(g, w) for g, w in leaves(got, want) if isinstance(w, bytes)]
    assert len(raws) == 6
    invert(buffers)
    for g, w in raws:
        assert type(g) is bytes
        assert g == w


class LargeRaw(msgspec.Struct):
    data: bytes
    scratch: bytearray
    pieces: list[bytes]


def test_large_bytes_fields_get_whole_copies_of_their_own() -> None:
    # Above a megabyte the copy is made by GIL-free memmoves, chunk by chunk: sizes that
    # are not a whole number of chunks, and fields beside and inside containers.
    want = LargeRaw(blob((9 << 20) + 3, 1), bytearray(blob((2 << 20) + 1, 2)), [blob(3 << 20, 3)])
    frame, buffers = controlled(MsgpackCodec().encode(want))
    got = MsgpackCodec().decode(frame, type=LargeRaw)
    assert (type(got.data), type(got.scratch), type(got.pieces[0])) == (bytes, bytearray, bytes)
    assert got == want
    invert(buffers)
    assert got == want


@SECONDARY_SETTINGS
@given(user_values())
def test_large_views_of_random_user_types_share_the_received_memory(
    case: tuple[UserType, Any],
) -> None:
    _, want = case
    frame, buffers = controlled(MsgpackCodec().encode(want))
    got = MsgpackCodec().decode(frame, type=type(want))
    received = spans(buffers)
    for g, w in leaves(got, want):
        if isinstance(w, bytes | bytearray):
            assert type(g) is type(w)  # a copy, as these types own their memory
        elif nbytes(w) >= THRESHOLD:
            assert within(g, received), f"a {type(w).__name__} field got a copy"


# -- bad input -----------------------------------------------------------------------------


class ErrRouted(msgspec.Struct, array_like=True, gc=False):
    data: bytes
    shape: list[int]
    dtype: str


class ErrMicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    input_ids: list[int]
    advantages: list[float]
    mm_tensors: dict[str, ErrRouted] | None = None
    metadata: dict[str, Any] | None = None


class ErrStep(msgspec.Struct, gc=False):
    micro_batches: list[ErrMicroBatch]


def err_step(batches: int = 5, tokens: int = 20) -> ErrStep:
    return ErrStep(
        [
            ErrMicroBatch(list(range(tokens)), [0.5] * tokens, metadata={"seed": i})
            for i in range(batches)
        ]
    )


def _set_id(batch: int, index: int, value: int, tokens: int = 20) -> Callable[[], ErrStep]:
    def make() -> ErrStep:
        step = err_step(max(5, batch + 1), tokens)
        step.micro_batches[batch].input_ids[index] = value
        return step

    return make


def _with(**changes: Any) -> Callable[[], ErrStep]:
    def make() -> ErrStep:
        step = err_step()
        for name, value in changes.items():
            setattr(step.micro_batches[3], name, value)
        return step

    return make


def _advantage_object() -> ErrStep:
    step = err_step()
    step.micro_batches[3].advantages[5] = object()  # type: ignore[call-overload]
    return step


#: (make the bad object, the path the message must name, whether it is the full path)
ENCODE_ERRORS: dict[str, tuple[Callable[[], ErrStep], str, bool]] = {
    "int-above-64-bits": (_set_id(3, 17, 2**64), "$.micro_batches[3].input_ids[17]", True),
    "int-below-64-bits": (_set_id(3, 17, -(2**63) - 1), "$.micro_batches[3].input_ids[17]", True),
    "in-a-long-list": (
        _set_id(3, 250, 2**70, tokens=300),
        "$.micro_batches[3].input_ids[250]",
        True,
    ),
    "in-a-very-long-list": (
        _set_id(3, 299_999, 2**70, tokens=300_000),
        "$.micro_batches[3].input_ids[299999]",
        True,
    ),
    "in-a-long-list-of-structs": (
        _set_id(1_500, 17, 2**64, tokens=20),
        "$.micro_batches[1500].input_ids[17]",
        True,
    ),
    "object-in-a-float-list": (_advantage_object, "$.micro_batches[3].advantages[5]", True),
    "object-in-an-any-field": (
        _with(metadata={"seed": 3, "note": object()}),
        "$.micro_batches[3].metadata",
        False,
    ),
    "object-in-a-long-dict": (
        _with(metadata={**{f"k{i}": i for i in range(50_000)}, "k40000": object()}),
        "$.micro_batches[3].metadata",
        False,
    ),
    "int-in-a-nested-struct": (
        _with(mm_tensors={"pixels": ErrRouted(b"x", [1, 2**65], "uint8")}),
        "$.micro_batches[3].mm_tensors",
        False,
    ),
}


@pytest.mark.parametrize(("make", "path", "full"), ENCODE_ERRORS.values(), ids=ENCODE_ERRORS.keys())
def test_unencodable_values_name_their_path(
    make: Callable[[], ErrStep], path: str, full: bool
) -> None:
    with pytest.raises(EncodeError) as info:
        MsgpackCodec().encode(make())
    message = str(info.value)
    assert path in message
    if full:  # the path ends there: not a prefix of [170] or of a deeper path
        assert re.search(re.escape(path) + r"(?![\w\[.])", message), message


def test_sender_refuses_unencodable_rank_and_writes_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "run")

    async def send() -> None:
        async with rlwire.open_sender(url) as sender:
            await sender.send_ranks([err_step(), _set_id(3, 17, 2**64)()])

    with pytest.raises(EncodeError) as info:
        anyio.run(send)
    assert info.value.rank == 1
    assert "$.micro_batches[3].input_ids[17]" in str(info.value)
    for rank in range(2):
        with rlwire.open_receiver(url, rank=rank, type=ErrStep) as receiver:
            assert receiver.poll() is None


class IdsAsText(msgspec.Struct, array_like=True):
    input_ids: list[str]
    advantages: list[float]


class NeedsMore(msgspec.Struct, array_like=True):
    input_ids: list[int]
    advantages: list[float]
    mm_tensors: dict[str, ErrRouted] | None
    metadata: dict[str, Any] | None
    reward: float


class RoutedAsArray(msgspec.Struct, array_like=True):
    data: np.ndarray
    shape: list[int]
    dtype: str


class RoutedAsInt(msgspec.Struct, array_like=True):
    data: int
    shape: list[int]
    dtype: str


class TaggedStep(msgspec.Struct, tag="step"):
    micro_batches: list[ErrMicroBatch]


class OtherTaggedStep(msgspec.Struct, tag="other"):
    micro_batches: list[ErrMicroBatch]


def _routed(size: int) -> dict[str, Any]:
    return {"pixels": ErrRouted(blob(size, 0), [size], "uint8")}


#: (the sent object, the type it is decoded into)
DECODE_ERRORS: dict[str, tuple[Any, Any]] = {
    "ints-as-text": ([ErrMicroBatch([1, 2], [0.5, 0.5])], list[IdsAsText]),
    "long-ints-as-text": ([ErrMicroBatch(list(range(5_000)), [])], list[IdsAsText]),
    "missing-field": ([ErrMicroBatch([1], [0.5])], list[NeedsMore]),
    "list-as-struct": ([ErrMicroBatch([1], [0.5])], ErrMicroBatch),
    "struct-as-int": (err_step(), int),
    "small-bytes-as-ndarray": (_routed(10), dict[str, RoutedAsArray]),
    "large-bytes-as-ndarray": (_routed(THRESHOLD * 2), dict[str, RoutedAsArray]),
    "large-bytes-as-int": (_routed(THRESHOLD * 2), dict[str, RoutedAsInt]),
    "other-tag": (TaggedStep(err_step().micro_batches), OtherTaggedStep),
    "ints-as-bools": ([ErrMicroBatch([7], [0.5])], list[list[list[bool]]]),
}


@pytest.mark.parametrize(("value", "type"), DECODE_ERRORS.values(), ids=DECODE_ERRORS.keys())
def test_decoding_into_a_mismatched_type_is_a_decode_error(value: Any, type: Any) -> None:
    frame = received(MsgpackCodec().encode(value))
    with pytest.raises(DecodeError):
        MsgpackCodec().decode(frame, type=type)


def test_receiver_decode_error_names_step_and_rank(tmp_path: Path) -> None:
    url = str(tmp_path / "run")

    async def send() -> None:
        async with rlwire.open_sender(url) as sender:
            await sender.send_ranks([[ErrMicroBatch([1], [0.5])]] * 2)

    anyio.run(send)
    with rlwire.open_receiver(url, rank=1, type=list[IdsAsText]) as receiver:
        with pytest.raises(DecodeError) as info:
            receiver.receive(timeout=TIMEOUT)
    assert (info.value.step, info.value.rank) == (0, 1)


# -- every built-in sink -------------------------------------------------------------------


@dataclass
class Sink:
    """One built-in sink: :meth:`fresh` gives a new URL below ``prefix`` each call."""

    prefix: str
    suffix: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    made: list[str] = field(default_factory=list)

    def fresh(self) -> str:
        self.made.append(f"{self.prefix}{uuid.uuid4().hex[:12]}{self.suffix}")
        return self.made[-1]


@pytest.fixture(params=["dir", "memory", "s3", "zmq"])
def sink(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sink]:
    name = request.param
    if name == "dir":
        yield Sink(f"{tmp_path}/")
    elif name == "memory":
        memory_sink = Sink("memory://rlwire-user-types-")
        yield memory_sink
        memory = fsspec.filesystem("memory")
        for url in memory_sink.made:
            if memory.exists(url):
                memory.rm(url, recursive=True)
    elif name == "s3":
        bucket = request.getfixturevalue("s3_url")
        yield Sink(f"{bucket}/", options=request.getfixturevalue("s3_endpoint"))
    else:  # ZeroMQ over ipc, with short socket paths (the OS caps them near 100 bytes)
        yield Sink(f"zmq+ipc://{tmp_path}/", ".sock")


async def send_and_receive(sink: Sink, payloads: list[Any], item_type: Any) -> list[Any]:
    """Send ``payloads[r]`` to rank ``r`` as one step and receive every rank.

    Receivers open first and receive beside the send: a socket sender may wait for them.
    """
    url = sink.fresh()
    got: list[Any] = []
    # A name no field of the types sent holds is refused: random types have none.
    sidecar = SIDECAR if "routed_experts" in item_type.__struct_fields__ else ()
    with ExitStack() as stack:
        receivers = [
            stack.enter_context(
                rlwire.open_receiver(
                    url,
                    rank=rank,
                    type=list_type(item_type),
                    storage_options=sink.options,
                )
            )
            for rank in range(len(payloads))
        ]

        async def send() -> None:
            async with rlwire.open_sender(
                url, sidecar=sidecar, storage_options=sink.options
            ) as sender:
                assert await sender.send_ranks(payloads) == 0

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            for receiver in receivers:
                got.append(await receiver.areceive(timeout=TIMEOUT))
                assert receiver.last_step == 0
    return got


@pytest.mark.anyio
@SINK_SETTINGS
@given(step=framework_steps())
async def test_framework_steps_round_trip_through_every_sink(
    sink: Sink, step: tuple[Framework, list[list[Any]]]
) -> None:
    fw, payloads = step
    got = await send_and_receive(sink, payloads, fw.micro_batch)
    assert got == payloads


@pytest.mark.anyio
@SINK_SETTINGS
@given(st.data())
async def test_random_user_types_round_trip_through_every_sink(
    sink: Sink, data: st.DataObject
) -> None:
    user = data.draw(user_types(depth=1))
    payloads = [data.draw(st.lists(user.values, max_size=3)) for _ in range(2)]
    assume(heft(payloads) <= BUDGET)
    got = await send_and_receive(sink, payloads, user.cls)
    assert_same(got, payloads)


class NumpyMicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """The same batch once a framework switches its big fields to numpy and memoryview."""

    input_ids: np.ndarray
    advantages: list[float]
    routed_experts: np.ndarray
    mm_tensors: dict[str, memoryview]
    env_names: list[str]
    teacher_logprobs: np.ndarray | None = None


def numpy_micro_batch(seed: int, tokens: int) -> NumpyMicroBatch:
    rng = np.random.default_rng(seed)
    return NumpyMicroBatch(
        input_ids=rng.integers(0, 150_000, tokens),
        advantages=rng.standard_normal(tokens).tolist(),
        routed_experts=rng.integers(0, 64, (tokens, 16, 8), dtype=np.uint16),
        mm_tensors={"image": memoryview(blob(30_000 + seed, seed))},
        env_names=["math"],
        teacher_logprobs=rng.standard_normal(tokens).astype(np.float32) if seed % 2 else None,
    )


@pytest.mark.anyio
async def test_a_few_megabytes_of_framework_batches_through_every_sink(sink: Sink) -> None:
    """Typical framework types: 2 ranks x 4 micro-batches of 2,048 tokens, each with
    512 KB of routed experts (uint16 ``[2048, 16, 8]``)."""
    rng = np.random.default_rng(8)
    shape = [2_048, 16, 8]
    payloads = [
        [
            msgspec.structs.replace(
                micro_batch(
                    TYPICAL, 2_048, 10 * rank + i, routed=False, images=i % 2, extras=bool(i)
                ),
                routed_experts=TYPICAL.routed(
                    data=rng.integers(0, 64, shape, dtype=np.uint16).tobytes(),
                    shape=shape,
                    dtype="uint16",
                ),
            )
            for i in range(4)
        ]
        for rank in range(2)
    ]
    got = await send_and_receive(sink, payloads, TYPICAL.micro_batch)
    assert got == payloads


@pytest.mark.anyio
async def test_numpy_and_memoryview_fields_through_every_sink(sink: Sink) -> None:
    payloads = [[numpy_micro_batch(10 * rank + i, 1_024) for i in range(3)] for rank in range(2)]
    got = await send_and_receive(sink, payloads, NumpyMicroBatch)
    assert_same(got, payloads)
