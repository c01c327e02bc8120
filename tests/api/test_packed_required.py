"""Samples held as columns without a field ``TrainingSample`` requires: a validating
sender refuses them, and a receiver of the default type refuses them as columns as it
does as samples (a ``DecodeError`` naming the field and the step's file), whether it
validates or not."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio

LENGTHS = [3, 5, 2]
REQUIRED = ("token_ids", "mask", "logprobs", "temperatures", "advantages", "env_name")


def _columns(without: str) -> dict[str, Any]:
    """Three samples' columns, every field TrainingSample requires but ``without``."""
    ids = rlwire.Ragged.from_lengths(np.arange(10), LENGTHS)
    columns: dict[str, Any] = {
        "token_ids": ids,
        "mask": rlwire.Ragged(np.ones(10, bool), ids.offsets),
        "logprobs": rlwire.Ragged(np.full(10, -0.5, np.float32), ids.offsets),
        "temperatures": rlwire.Ragged(np.ones(10, np.float32), ids.offsets),
        "advantages": rlwire.Ragged(np.zeros(10, np.float32), ids.offsets),
        "env_name": ["gsm8k"] * len(LENGTHS),
    }
    del columns[without]
    return columns


def _rows(columns: dict[str, Any]) -> list[dict[str, Any]]:
    """The same samples as dicts, which the sender stores as columns too."""
    return [{name: column[i] for name, column in columns.items()} for i in range(len(LENGTHS))]


def _missing(without: str) -> str:
    return rf"the columns hold no '{without}', a field TrainingSample requires - at `\$\.samples`"


@pytest.mark.parametrize("without", REQUIRED)
async def test_a_validating_sender_refuses_packed_samples_without_a_required_field(
    tmp_path: Path, without: str
) -> None:
    batch = rlwire.TrainingBatch(samples=rlwire.Columns(_columns(without)))  # type: ignore[arg-type]
    async with rlwire.open_sender(tmp_path) as sender:
        match = rf"^step 0, rank 0: \$\.samples: no column '{without}' \(TrainingSample requires"
        with pytest.raises(rlwire.SchemaError, match=match):
            await sender.send(batch)
    assert not list(tmp_path.glob("step-*"))


@pytest.mark.parametrize("without", ["token_ids", "logprobs"])
@pytest.mark.parametrize("sent", ["packed", "dicts"])
async def test_a_receiver_refuses_columns_without_a_required_field_as_it_refuses_samples(
    tmp_path: Path, without: str, sent: str
) -> None:
    """Before, ``as_columns=True`` returned the TrainingBatch whatever its columns were
    (a step received as samples was refused), unless the receiver validated."""
    columns = _columns(without)
    samples = rlwire.Columns(columns) if sent == "packed" else _rows(columns)
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        await sender.send({"samples": samples})
    file = re.escape(str(tmp_path / "step-00000000.rank-0000.rlw"))
    refused = rf"^{file}: received data does not match list\[TrainingSample\]: "
    as_samples = rf"Object missing required field `{without}` - at `\$\.samples\[0\]`"
    for validate in (False, True):
        for as_columns, why in ((False, as_samples), (True, _missing(without))):
            with rlwire.open_receiver(
                tmp_path, validate=validate, as_columns=as_columns, record_consumed=False
            ) as receiver:
                with pytest.raises(rlwire.DecodeError, match=refused + why) as caught:
                    await receiver.areceive(timeout=5)
                assert caught.value.step == 0
    # Received as dicts, or some fields of them, the same columns arrive.
    with rlwire.open_receiver(
        tmp_path, type=dict, as_columns=True, record_consumed=False
    ) as receiver:
        got = (await receiver.areceive(timeout=5))["samples"]
    assert isinstance(got, rlwire.Columns) and got.names == tuple(columns)
    with rlwire.open_receiver(tmp_path, fields=("mask",), record_consumed=False) as receiver:
        some = (await receiver.areceive(timeout=5)).samples
    assert isinstance(some, rlwire.Columns) and some.names == ("mask",)


async def test_parts_as_columns_without_a_required_field_are_refused(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        async with sender.open_step() as writer:
            await writer.put(_rows(_columns("advantages")), key="a")
            await writer.put(_rows(_columns("advantages")), key="b")
    with rlwire.open_receiver(tmp_path, as_columns=True, record_consumed=False) as receiver:
        with pytest.raises(
            rlwire.DecodeError, match=r"part-000000\.rlw: .*" + _missing("advantages")
        ):
            async for _ in receiver.aparts(timeout=5):
                pass
    with rlwire.open_receiver(tmp_path, as_columns=True, record_consumed=False) as receiver:
        with pytest.raises(rlwire.DecodeError, match=_missing("advantages")):
            await receiver.areceive(timeout=5)


async def test_a_required_field_appended_to_the_step_completes_its_columns(
    tmp_path: Path,
) -> None:
    """The columns are looked at with the fields appended to the step."""
    columns = _columns("advantages")
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        await sender.send(rlwire.TrainingBatch(samples=rlwire.Columns(columns)))  # type: ignore[arg-type]
        with rlwire.open_receiver(tmp_path, as_columns=True, record_consumed=False) as receiver:
            with pytest.raises(rlwire.DecodeError, match=_missing("advantages")):
                await receiver.areceive(timeout=5)
            offsets = columns["token_ids"].offsets
            advantages = rlwire.Ragged(np.ones(10, np.float32), offsets)
            await sender.add_fields(0, {"advantages": advantages})
            got = (await receiver.areceive(timeout=5)).samples
    assert isinstance(got, rlwire.Columns)
    assert got["advantages"].values.tolist() == [1.0] * 10
