"""An appended field never takes the place of the step's own data: not of a key the
step's samples hold in their ``extras``, nor of a key of dict samples stored as a plain
list (not as columns). add_fields refuses such a name with a SchemaError, as it does a
column the step holds data in (by its stored name or, for a renamed Struct field, its
attribute name), and the step reads back as sent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest

import rlwire
from rlwire.testing import make_sample

pytestmark = pytest.mark.anyio

LENGTHS = (3, 5, 2)


async def test_a_key_of_the_steps_extras_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    scored = msgspec.structs.replace(make_sample(2, routed=False), extras={"score": np.array(7.0)})
    samples = [scored, make_sample(3, routed=False)]
    async with rlwire.open_sender(url) as sender:
        await sender.send(rlwire.TrainingBatch(samples=samples))
        with pytest.raises(rlwire.SchemaError, match="'score'") as info:
            await sender.add_fields(0, {"score": [1.0, 2.0]})
        assert "step 0" in str(info.value)
        await sender.add_fields(0, {"other": [1.0, 2.0]})  # a new key is taken
    with rlwire.open_receiver(url) as receiver:
        got = receiver.receive(timeout=20).samples
    assert float(got[0].extras["score"]) == 7.0
    assert "score" not in got[1].extras
    assert [float(s.extras["other"]) for s in got] == [1.0, 2.0]


async def test_a_key_of_dict_samples_not_stored_as_columns_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url) as sender:
        # Numbers alone: the list is stored as it is, not as columns.
        await sender.send({"samples": [{"a": 1, "x": 5}, {"a": 2, "x": 6}]})
        with pytest.raises(rlwire.SchemaError, match="'x'"):
            await sender.add_fields(0, {"x": [10, 20]})
        await sender.add_fields(0, {"z": [10, 20]})
    with rlwire.open_receiver(url, type=dict) as receiver:
        got = receiver.receive(timeout=20)
    assert got["samples"] == [{"a": 1, "x": 5, "z": 10}, {"a": 2, "x": 6, "z": 20}]


class Camel(msgspec.Struct, rename="camel"):
    token_ids: np.ndarray
    ref_logprobs: np.ndarray | None = None
    extras: dict[str, Any] = {}


class CamelBatch(msgspec.Struct):
    samples: list[Camel]


async def test_a_renamed_structs_field_is_refused_by_either_name(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    own = [np.full(n, 1.0, np.float32) for n in LENGTHS]
    ragged = rlwire.Ragged.from_lengths(np.full(10, 9.0, np.float32), list(LENGTHS))
    async with rlwire.open_sender(url, storage_options=options, validate=False) as sender:
        await sender.send(CamelBatch([Camel(np.arange(n), own[i]) for i, n in enumerate(LENGTHS)]))
        # Stored as tokenIds and refLogprobs: the attribute names are the same fields.
        for name, held in (("ref_logprobs", "refLogprobs"), ("token_ids", "tokenIds")):
            with pytest.raises(rlwire.SchemaError, match=f"'{name}' as '{held}'") as info:
                await sender.add_fields(0, {name: ragged})
            assert "step 0" in str(info.value)
        with pytest.raises(rlwire.SchemaError, match="'refLogprobs'"):
            await sender.add_fields(0, {"refLogprobs": ragged})
    async with rlwire.open_receiver(url, storage_options=options, type=CamelBatch) as receiver:
        with anyio.fail_after(20):
            got = (await receiver.areceive()).samples
    assert [s.ref_logprobs.tolist() for s in got] == [o.tolist() for o in own]
    assert [s.token_ids.tolist() for s in got] == [list(range(n)) for n in LENGTHS]


async def test_a_renamed_field_left_empty_is_filled_by_its_attribute_name(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    ragged = rlwire.Ragged.from_lengths(np.full(10, 9.0, np.float32), list(LENGTHS))
    async with rlwire.open_sender(url, validate=False) as sender:
        await sender.send(CamelBatch([Camel(np.arange(n)) for n in LENGTHS]))
        await sender.add_fields(0, {"ref_logprobs": ragged})
        with pytest.raises(rlwire.SchemaError, match="appended to the step already"):
            await sender.add_fields(0, {"refLogprobs": ragged})  # the same field, again
    async with rlwire.open_receiver(url, type=CamelBatch) as receiver:
        got = (await receiver.areceive()).samples
    assert [s.ref_logprobs.tolist() for s in got] == [[9.0] * n for n in LENGTHS]


class Mapped(msgspec.Struct, rename={"score": "s"}):
    token_ids: np.ndarray
    score: float | None = None


class MappedBatch(msgspec.Struct):
    samples: list[Mapped]


async def test_a_field_renamed_by_a_mapping_is_never_filled_over_its_data(
    tmp_path: Path,
) -> None:
    # The step stores "s": add_fields cannot tell that "score" is the same field, and
    # takes it; a receiver of the Struct refuses to put it in place of the step's data.
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url, validate=False) as sender:
        await sender.send(MappedBatch([Mapped(np.arange(n), score=1.0) for n in LENGTHS]))
        await sender.add_fields(0, {"score": np.full(3, 7.0)})
    async with rlwire.open_receiver(url, type=MappedBatch) as receiver:
        with pytest.raises(rlwire.DecodeError, match=r"'score' row 0.*stored as 's'"):
            await receiver.areceive()
    async with rlwire.open_receiver(url, type=dict, as_columns=True) as receiver:
        cols = (await receiver.areceive())["samples"]
    assert cols["s"].tolist() == [1.0, 1.0, 1.0]
    assert cols["score"].tolist() == [7.0, 7.0, 7.0]


class First(msgspec.Struct, array_like=True, tag=True):
    token_ids: np.ndarray
    score: float


class Second(msgspec.Struct, array_like=True, tag=True):
    token_ids: np.ndarray
    score: float


class MixedBatch(msgspec.Struct):
    samples: list[First | Second]


async def test_samples_stored_by_position_take_no_field(tmp_path: Path) -> None:
    # Two array_like types: a plain list of lists, which keeps no field names.
    url = str(tmp_path / "run")
    sent = [First(np.arange(3), 1.0), Second(np.arange(5), 2.0), First(np.arange(2), 3.0)]
    async with rlwire.open_sender(url, validate=False) as sender:
        await sender.send(MixedBatch(sent))
        for name in ("score", "token_ids", "other"):
            with pytest.raises(rlwire.SchemaError, match=rf"'{name}'.*stored by position"):
                await sender.add_fields(0, {name: [7.0, 7.0, 7.0]})
    async with rlwire.open_receiver(url, type=MixedBatch) as receiver:
        got = (await receiver.areceive()).samples
    assert [(type(s), s.score, s.token_ids.tolist()) for s in got] == [
        (type(s), s.score, s.token_ids.tolist()) for s in sent
    ]
