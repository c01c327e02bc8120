"""A step whose object holds another list beside its samples (a second list of Structs
with array fields, stored as columns too; a list of strings): receivers merge appended
fields into the one list of samples a step holds, so ``add_fields`` refuses such a step
with a ``ConfigError`` naming the lists, before anything is written, and the step reads
back as sent. Before, the fields were stored and every receive of the step failed
("holds no list of samples"), as rows and as columns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio

LENGTHS = (3, 5, 2)


class Sample(msgspec.Struct):
    token_ids: np.ndarray
    advantages: np.ndarray | None = None
    env_name: str = ""


class Other(msgspec.Struct):
    values: np.ndarray
    tag: str = ""


class Batch(msgspec.Struct):
    samples: list[Sample]
    others: list[Other]


def _batch() -> Batch:
    return Batch(
        samples=[Sample(np.arange(n), env_name="gsm8k") for n in LENGTHS],
        others=[Other(np.arange(n, dtype=np.float32), tag="t") for n in (4, 1)],
    )


def _assert_as_sent(got: Any) -> None:
    want = _batch()
    assert type(got) is Batch
    assert all(type(s) is Sample for s in got.samples)
    assert all(type(o) is Other for o in got.others)
    assert [s.token_ids.tolist() for s in got.samples] == [
        s.token_ids.tolist() for s in want.samples
    ]
    assert [s.advantages for s in got.samples] == [None] * len(LENGTHS)
    assert [(o.values.dtype, o.values.tolist(), o.tag) for o in got.others] == [
        (o.values.dtype, o.values.tolist(), o.tag) for o in want.others
    ]


async def test_a_second_list_of_structs_beside_the_samples_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    advantages = rlwire.Ragged.from_lengths(np.zeros(sum(LENGTHS), np.float32), list(LENGTHS))
    async with rlwire.open_sender(url, validate=False) as sender:
        await sender.send(_batch())
        with pytest.raises(rlwire.ConfigError, match=r"'samples', 'others'") as caught:
            await sender.add_fields(0, {"advantages": advantages})
    assert "step 0" in str(caught.value)
    assert not list((tmp_path / "run").glob("*fields*"))  # nothing written
    async with rlwire.open_receiver(url, type=Batch, record_consumed=False) as receiver:
        _assert_as_sent(await receiver.areceive(timeout=20))
    with rlwire.open_receiver(url, type=Batch, record_consumed=False) as receiver:
        _assert_as_sent(receiver.receive(timeout=20))


# A long list is stored in chunks (a header's chunked list); JSON stores no columns.
@pytest.mark.parametrize(
    ("codec", "tags"),
    [("msgpack", ["a", "b"]), ("msgpack", [f"t{i}" for i in range(20000)]), ("json", ["a", "b"])],
)
async def test_a_list_of_strings_beside_the_samples_is_refused(
    tmp_path: Path, codec: str, tags: list[str]
) -> None:
    url = str(tmp_path / "run")
    samples = [{"token_ids": np.arange(n)} for n in LENGTHS]
    async with rlwire.open_sender(url, validate=False, codec=codec) as sender:
        await sender.send({"tags": tags, "samples": samples})
        with pytest.raises(rlwire.ConfigError, match=r"holds lists 'tags', 'samples'"):
            await sender.add_fields(0, {"score": np.arange(3.0)})
    assert not list((tmp_path / "run").glob("*fields*"))
    with rlwire.open_receiver(url, type=Any, record_consumed=False) as receiver:
        got = receiver.receive(timeout=20)
    assert got["tags"] == tags
    assert [list(s["token_ids"]) for s in got["samples"]] == [list(range(n)) for n in LENGTHS]
