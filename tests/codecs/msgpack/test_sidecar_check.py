"""The msgpack codec's check of its ``sidecar`` names against the messages it encodes:
which names are refused (no message of the types encoded can hold them), which are
warned about (a dict's keys could), and which are settled for good."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, TypedDict

import msgspec
import numpy as np
import pytest

import rlwire
from rlwire.codecs import MsgpackCodec


class Inner(msgspec.Struct):
    data: bytes


class Outer(msgspec.Struct, rename="camel"):
    token_ids: list[int]
    expert_ids: Inner | None = None


@dataclasses.dataclass
class Record:
    logits: np.ndarray


class Typed(TypedDict, total=False):
    hidden: np.ndarray


class Holder(msgspec.Struct):
    extra: Typed


class Open(msgspec.Struct):
    payload: Any


def _refused(codec: MsgpackCodec, obj: Any) -> str:
    with pytest.raises(rlwire.ConfigError) as caught:
        codec.encode(obj)
    return str(caught.value)


@pytest.mark.parametrize(
    ("obj", "names"),
    [
        (Outer([1]), "Inner, Outer: data, expertIds, expert_ids, tokenIds, token_ids"),
        ([Record(np.zeros(3))], "Record: logits"),
        (Outer([1], Inner(b"x")), "Inner, Outer: data"),
    ],
    ids=["struct", "dataclass", "nested"],
)
def test_a_name_no_record_type_holds_is_refused(obj: Any, names: str) -> None:
    message = _refused(MsgpackCodec(sidecar=("expert_id",)), obj)
    assert f"({names}" in message
    assert "'expert_id' matches no field or key" in message


def test_every_name_of_a_struct_is_known_however_it_is_spelt() -> None:
    """A renamed field answers to its attribute name and its encoded name; a field that
    cannot hold a buffer (``list[int]``) is a field all the same."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("expert_ids", "expertIds", "token_ids", "data"):
            MsgpackCodec(sidecar=(name,)).encode(Outer([1], Inner(b"x")))


def test_a_typed_dict_names_its_keys_even_absent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MsgpackCodec(sidecar=("hidden",)).encode(Holder(extra={}))


@pytest.mark.parametrize(
    "obj",
    [
        {"token_ids": np.arange(3)},
        Open(payload=1),  # Any: a dict in another message
        rlwire.Columns({"token_ids": rlwire.Ragged(np.arange(3), [0, 3])}),
        [{"a": np.arange(3)}, {"a": np.arange(2)}],  # stored as columns
    ],
    ids=["dict", "any", "columns", "dict-rows"],
)
def test_a_name_a_dict_could_hold_is_warned_about_once(obj: Any) -> None:
    codec = MsgpackCodec(sidecar=("routed_experts",))
    with pytest.warns(rlwire.SidecarWarning, match="'routed_experts' matched no field or key"):
        codec.encode(obj)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codec.encode(obj)


@pytest.mark.parametrize(
    "obj",
    [
        rlwire.Columns({"hidden": rlwire.Ragged(np.arange(3), [0, 3])}),
        [{"hidden": np.arange(3)}, {"hidden": np.arange(2)}],
        {"a": {"b": [{"hidden": 1}]}},
    ],
    ids=["columns", "dict-rows", "deep"],
)
def test_a_key_matched_settles_the_name(obj: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codec = MsgpackCodec(sidecar=("hidden",))
        codec.encode(obj)
        codec.encode({"other": 1})  # met once: never checked again


def test_only_the_names_left_are_named() -> None:
    codec = MsgpackCodec(sidecar=("token_ids", "expert_id"))
    message = _refused(codec, Outer([1]))
    assert "'expert_id'" in message and "'token_ids' matches" not in message


def test_a_message_that_tells_nothing_leaves_the_names_to_the_next() -> None:
    """An empty list, a lone array: no record type, no dict; the next message decides."""
    codec = MsgpackCodec(sidecar=("expert_id",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        codec.encode([])
        codec.encode(np.arange(3))
    assert "'expert_id' matches no field" in _refused(codec, [Outer([1])])
