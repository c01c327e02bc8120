"""``receive()`` with ``fields=`` (and ``as_columns=True``) of a step filled part by part:
one Columns of the rank's parts joined in index order, as for a step sent whole; the
appended fields beside; parts that cannot be joined refused in words naming them. Files
and the test S3 server, asyncio and trio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio

LENGTHS = ((3, 5), (), (2,), (4, 1, 6))  # the samples' token counts, part by part


def _sample(n: int, seed: int, ref: bool = False) -> rlwire.TrainingSample:
    rng = np.random.default_rng(seed)
    return rlwire.TrainingSample(
        token_ids=rng.integers(0, 50_000, n, dtype=np.int32),
        mask=rng.random(n) < 0.5,
        logprobs=-rng.random(n).astype(np.float32),
        temperatures=np.ones(n, np.float32),
        advantages=rng.random(n).astype(np.float32),
        env_name=f"env-{seed}",
        ref_logprobs=-rng.random(n).astype(np.float32) if ref else None,
    )


def _parts(ref: bool = False) -> list[list[rlwire.TrainingSample]]:
    seeds = iter(range(100))
    return [
        [_sample(n, next(seeds), ref and i == 0) for n in part] for i, part in enumerate(LENGTHS)
    ]


async def _send_parts(url: str, options: dict[str, Any], parts: list[list[Any]]) -> None:
    async with rlwire.open_sender(url, storage_options=options) as sender:
        async with sender.open_step() as writer:
            for i, samples in enumerate(parts):
                await writer.put(samples, key=f"group-{i}", rank=0)


async def _receive(url: str, options: dict[str, Any], **how: Any) -> Any:
    async with rlwire.open_receiver(url, storage_options=options, **how) as receiver:
        with anyio.fail_after(20):
            return await receiver.areceive()


async def test_fields_of_a_step_filled_part_by_part_are_its_parts_joined(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    parts = _parts()
    samples = [s for part in parts for s in part]
    await _send_parts(url, options, parts)
    got = await _receive(url, options, fields=["token_ids", "advantages"])
    assert isinstance(got, rlwire.TrainingBatch) and isinstance(got.samples, rlwire.Columns)
    cols = got.samples
    assert cols.names == ("token_ids", "advantages") and len(cols) == len(samples)
    for name in cols.names:
        column = cols[name]
        assert isinstance(column, rlwire.Ragged)
        assert column.dtype == getattr(samples[0], name).dtype
        assert [row.tolist() for row in column] == [getattr(s, name).tolist() for s in samples]
        assert not column.values.flags.writeable and not column.offsets.flags.writeable
    # The same as the parts read one by one, joined by hand.
    async with rlwire.open_receiver(url, storage_options=options, fields=["token_ids"]) as rx:
        each = [p.value.samples async for p in rx.aparts(timeout=20)]
    each = [part["token_ids"] for part in each if len(part)]  # (a part of none: [])
    assert np.array_equal(cols["token_ids"].values, np.concatenate([r.values for r in each]))


async def test_as_columns_joins_every_column_and_writable_copies_are_writable(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    parts = _parts(ref=True)  # ref_logprobs in part 0's samples only: None after
    samples = [s for part in parts for s in part]
    await _send_parts(url, options, parts)
    got = await _receive(url, options, as_columns=True, writable=True)
    cols = got.samples
    assert len(cols) == len(samples)
    assert cols["env_name"] == [s.env_name for s in samples]
    assert np.array_equal(cols["mask"].values, np.concatenate([s.mask for s in samples]))
    assert cols["mask"].values.flags.writeable
    # A Ragged in one part and None in the others: a value a row, as one message keeps it.
    refs = cols["ref_logprobs"]
    assert isinstance(refs, list) and refs[2:] == [None] * (len(samples) - 2)
    assert [r.tolist() for r in refs[:2]] == [s.ref_logprobs.tolist() for s in samples[:2]]


async def test_fields_of_parts_beside_fields_appended_to_the_step(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    parts = _parts()
    samples = [s for part in parts for s in part]
    await _send_parts(url, options, parts)
    lengths = [s.seq_len for s in samples]
    ref = rlwire.Ragged.from_lengths(np.arange(sum(lengths), dtype=np.float32), lengths)
    stage = rlwire.open_sender(url, storage_options=options)
    try:
        await stage.add_fields(0, {"ref_logprobs": ref})
    finally:
        await stage.aclose()
    cols = (await _receive(url, options, fields=("token_ids", "ref_logprobs"))).samples
    assert set(cols.names) == {"token_ids", "ref_logprobs"}
    assert np.array_equal(cols["ref_logprobs"].values, ref.values)
    assert np.array_equal(cols["token_ids"].offsets, ref.offsets)


async def test_parts_asked_for_a_field_appended_to_the_step_say_where_it_is(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """``parts()`` hands out the parts as committed: a field appended to the step since is
    in none of them, and the error says so and where it is (it said "not in the step")."""
    url, options = file_or_s3
    await _send_parts(url, options, [[{"token_ids": np.arange(n)} for n in (3, 2)]])
    ref = rlwire.Ragged.from_lengths(np.zeros(5, np.float32), [3, 2])
    stage = rlwire.open_sender(url, storage_options=options)
    try:
        await stage.add_fields(0, {"ref": ref})
    finally:
        await stage.aclose()
    how = {"type": list, "fields": ("ref",), "record_consumed": False}
    async with rlwire.open_receiver(url, storage_options=options, **how) as receiver:
        with pytest.raises(rlwire.FieldNotFoundError) as info:
            async for _ in receiver.aparts(timeout=20):
                pass
    message = str(info.value)
    assert "'ref' not in the part (its samples hold: token_ids)" in message, message
    assert "receive() reads the step with them" in message, message
    got = await _receive(url, options, **how)
    assert np.array_equal(got["ref"].values, ref.values)


@pytest.mark.parametrize("lengths", [((), (3, 5), (2,)), ((), (), (4,)), ((3,), (), (2, 6))])
async def test_appended_fields_alone_of_a_step_whose_first_parts_are_empty(
    file_or_s3: tuple[str, dict[str, Any]], lengths: tuple[tuple[int, ...], ...]
) -> None:
    """``fields=`` naming appended fields alone (examples/async_rl.py's trainers) of a
    step whose first part holds no sample (``put([])``: a group filtered out): the
    step's rows are its parts', not its first part's (before session 29: DecodeError
    "fields appended for 3 rows, the step holds 0", naming a main file the step has not)."""
    url, options = file_or_s3
    seeds = iter(range(100))
    await _send_parts(url, options, [[_sample(n, next(seeds)) for n in part] for part in lengths])
    rows = [n for part in lengths for n in part]
    ref = rlwire.Ragged.from_lengths(np.arange(sum(rows), dtype=np.float32), rows)
    stage = rlwire.open_sender(url, storage_options=options)
    try:
        await stage.add_fields(0, {"ref_logprobs": ref})
    finally:
        await stage.aclose()
    cols = (await _receive(url, options, fields=("ref_logprobs",))).samples
    assert cols.names == ("ref_logprobs",) and len(cols) == len(rows)
    assert [r.tolist() for r in cols["ref_logprobs"]] == [r.tolist() for r in ref]
    both = (await _receive(url, options, fields=("token_ids", "ref_logprobs"))).samples
    assert np.array_equal(both["token_ids"].offsets, ref.offsets)


class _NotSamples(msgspec.Struct):
    samples: list[int]


async def test_a_decode_error_of_a_step_filled_part_by_part_names_its_parts(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """A step filled part by part has no main file: an error decoding it names its first
    part's file, and how many parts followed (before session 29: the main file)."""
    url, options = file_or_s3
    await _send_parts(url, options, _parts()[:2])
    with pytest.raises(rlwire.DecodeError) as caught:
        await _receive(url, options, type=_NotSamples)
    assert caught.value.where is not None
    assert caught.value.where.endswith("step-00000000.rank-0000.part-000000.rlw (and 1 more part)")


async def test_parts_of_other_fields_are_refused_naming_them(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """Dict samples whose keys differ from part to part: no one Columns holds them all.
    ``fields=`` of the keys they share still joins."""
    url, options = file_or_s3
    await _send_parts(
        url,
        options,
        [
            [{"token_ids": np.arange(3), "values": np.zeros(3)}],
            [{"token_ids": np.arange(2)}],
        ],
    )
    with pytest.raises(rlwire.ConfigError) as caught:
        await _receive(url, options, type=list, as_columns=True)
    message = str(caught.value)
    assert "part 0 holds the fields ['token_ids', 'values'] and part 1 ['token_ids']" in message
    assert "parts()" in message and "step 0, rank 0" in message
    assert "as_columns" not in message
    got = await _receive(url, options, type=list, fields=("token_ids",))
    assert got["token_ids"].offsets.tolist() == [0, 3, 5]


@pytest.mark.parametrize(
    "numbers",
    [(1, 1.5), (1.5, 1), (1, True), (1, 2), (1.5, 2.5), (True, False), (1, None), (2**64 - 1, 1)],
)
async def test_a_number_column_of_parts_is_joined_as_one_message_keeps_it(
    tmp_path: Path, numbers: tuple[Any, Any]
) -> None:
    # Ints in one part and floats (or bools) in another were joined as numpy scalars
    # (np.int64(1), np.float64(1.5)); one message holding the rows lists Python numbers.
    rows = [{"x": np.arange(3 - i), "n": n} for i, n in enumerate(numbers)]
    whole, parted = str(tmp_path / "whole"), str(tmp_path / "parted")
    async with rlwire.open_sender(whole, validate=False) as sender:
        await sender.send({"samples": rows})
    async with rlwire.open_sender(parted, validate=False) as sender:
        async with sender.open_step() as writer:
            for i, row in enumerate(rows):
                await writer.put([row], key=i)
    one = (await _receive(whole, {}, type=Any, as_columns=True))["samples"]["n"]
    joined = (await _receive(parted, {}, type=Any, as_columns=True))["n"]
    assert type(joined) is type(one)
    if isinstance(one, np.ndarray):
        assert joined.dtype == one.dtype and joined.tolist() == one.tolist()
    else:
        assert [(type(v), v) for v in joined] == [(type(v), v) for v in one]
