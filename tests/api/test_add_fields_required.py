"""A field ``TrainingSample`` requires, left out by the producer (``advantages``, computed
by a later stage) and appended with ``add_fields``: a receiver of Structs gets its
samples whole, as rows as it does as columns; a step it still leaves out is refused
with the ``DecodeError`` a step that never had it gets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio

LENGTHS = (3, 5, 2)


def _rows(lengths: tuple[int, ...] = LENGTHS) -> list[dict[str, Any]]:
    """Samples as the rollout producer sends them: every field but ``advantages``."""
    return [
        {
            "token_ids": np.arange(n),
            "mask": np.ones(n, bool),
            "logprobs": np.full(n, -0.5, np.float32),
            "temperatures": np.ones(n, np.float32),
            "env_name": "gsm8k",
        }
        for n in lengths
    ]


def _advantages(lengths: tuple[int, ...] = LENGTHS) -> rlwire.Ragged:
    values = np.arange(sum(lengths), dtype=np.float32)
    return rlwire.Ragged.from_lengths(values, list(lengths))


def _missing(url: str) -> str:
    """Today's refusal of a step without ``advantages``, received as TrainingSamples."""
    return (
        rf"^{re.escape(url)}/step-00000000\.rank-0000\.rlw: received data does not match "
        r"list\[TrainingSample\]: Object missing required field `advantages` - at "
        r"`\$\.samples\[0\]`"
    )


async def test_an_appended_required_field_completes_the_samples_received_as_rows(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """Before, the step was decoded into TrainingSamples before the appended fields were
    merged: every receive of a step without ``advantages`` failed, appended or not."""
    url, options = file_or_s3
    advantages = _advantages()
    async with rlwire.open_sender(url, storage_options=options, validate=False) as sender:
        await sender.send({"samples": _rows()})
        async with rlwire.open_receiver(
            url, storage_options=options, record_consumed=False
        ) as receiver:
            with pytest.raises(rlwire.DecodeError, match=_missing(url)):
                await receiver.areceive(timeout=20)
        await sender.add_fields(0, {"advantages": advantages, "score": np.array([1, 2, 3.0])})
    for validate in (False, True):
        async with rlwire.open_receiver(
            url, storage_options=options, validate=validate, record_consumed=False
        ) as receiver:
            with anyio.fail_after(20):
                batch = await receiver.areceive()
        samples = batch.samples
        assert isinstance(samples, list)
        assert all(type(s) is rlwire.TrainingSample for s in samples)
        assert [s.advantages.tolist() for s in samples] == [
            advantages[i].tolist() for i in range(3)
        ]
        assert [s.token_ids.tolist() for s in samples] == [list(range(n)) for n in LENGTHS]
        assert [s.env_name for s in samples] == ["gsm8k"] * 3
        # A field TrainingSample does not declare is in extras, as it was before.
        assert [float(s.extras["score"]) for s in samples] == [1.0, 2.0, 3.0]
        assert receiver.last_stats is not None and receiver.last_stats.step == 0


async def test_a_required_field_still_missing_after_the_merge_is_refused_as_before(
    tmp_path: Path,
) -> None:
    url = str(tmp_path / "run")
    async with rlwire.open_sender(url, validate=False) as sender:
        # 100 rows: made rows past the codec's first group, the row said is still 0.
        await sender.send({"samples": _rows((2,) * 100)})
        await sender.add_fields(0, {"ref_logprobs": _advantages((2,) * 100)})
    for validate in (False, True):
        with rlwire.open_receiver(url, validate=validate, record_consumed=False) as receiver:
            with pytest.raises(rlwire.DecodeError, match=_missing(url)) as caught:
                await receiver.areceive(timeout=20)
        assert caught.value.step == 0


class Sample(msgspec.Struct):
    token_ids: np.ndarray
    advantages: np.ndarray
    env_name: str = ""


class Batch(msgspec.Struct):
    samples: list[Sample]


async def test_a_users_struct_type_gets_its_samples_completed(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    advantages = _advantages()
    async with rlwire.open_sender(url, validate=False) as sender:
        await sender.send({"samples": _rows()})
        await sender.add_fields(0, {"advantages": advantages})
    with rlwire.open_receiver(url, type=Batch, record_consumed=False) as receiver:
        got = (await receiver.areceive(timeout=20)).samples
    assert all(type(s) is Sample for s in got)
    assert [s.advantages.tolist() for s in got] == [advantages[i].tolist() for i in range(3)]
    assert [s.token_ids.tolist() for s in got] == [list(range(n)) for n in LENGTHS]


async def test_a_step_filled_part_by_part_gets_its_samples_completed(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    advantages = _advantages()
    async with rlwire.open_sender(url, validate=False) as sender:
        async with sender.open_step() as writer:
            await writer.put(_rows(LENGTHS[:2]), key="a")
            await writer.put(_rows(LENGTHS[2:]), key="b")
        await sender.add_fields(0, {"advantages": advantages})
    with rlwire.open_receiver(url, validate=True, record_consumed=False) as receiver:
        got = (await receiver.areceive(timeout=20)).samples
    assert [s.advantages.tolist() for s in got] == [advantages[i].tolist() for i in range(3)]
    assert [len(s.token_ids) for s in got] == list(LENGTHS)
