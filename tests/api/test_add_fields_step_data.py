"""An appended field never takes the place of the step's own data: not of a key the
step's samples hold in their ``extras``, nor of a key of dict samples stored as a plain
list (not as columns). add_fields refuses such a name with a SchemaError, as it does a
column the step holds data in, and the step reads back as sent."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

import rlwire
from rlwire.testing import make_sample

pytestmark = pytest.mark.anyio


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
