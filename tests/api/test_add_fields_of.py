"""``add_fields(..., of=receiver.last_stats.message_id)``: fields computed from a step
are stored beside that message only. A producer restarted with ``overwrite`` sends the
step again, same shape, other values; a stage holding fields computed from the first
is refused and writes nothing, one computed from the second is stored. Files and S3, a
step sent whole and one filled part by part; asyncio and trio."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio


async def _send(url: str, options: dict[str, Any], first: int, parted: bool) -> None:
    """Step 0 of two samples of 2 and 3 tokens, ``first`` the first token id."""
    async with rlwire.open_sender(
        url, storage_options=options, on_existing="overwrite" if first else "error"
    ) as sender:
        if not parted:
            ids = rlwire.Ragged.from_lengths(np.arange(first, first + 5), [2, 3])
            await sender.send({"samples": rlwire.Columns({"token_ids": ids})})
            return
        async with sender.open_step() as writer:
            await writer.put([{"token_ids": np.arange(first, first + 2)}], key="a")
            await writer.put([{"token_ids": np.arange(first + 2, first + 5)}], key="b")


async def _read(url: str, options: dict[str, Any], parted: bool) -> tuple[list[int], bytes]:
    """Step 0's first token id of each sample, its score (-1 without one) appended,
    and the message id the receiver gives."""
    async with rlwire.open_receiver(
        url, storage_options=options, type=list if parted else dict, record_consumed=False
    ) as receiver:
        with anyio.fail_after(20):
            got = await receiver.areceive()
        stats = receiver.last_stats
    assert stats is not None
    rows = got if parted else got["samples"]
    return [int(r["token_ids"][0]) * 10 + int(r.get("score", -1)) for r in rows], stats.message_id


async def _add(url: str, options: dict[str, Any], of: Any) -> None:
    stage = rlwire.open_sender(url, storage_options=options)  # opens nothing, deletes nothing
    try:
        await stage.add_fields(0, {"score": np.array([7, 8])}, of=of)
    finally:
        await stage.aclose()


@pytest.mark.parametrize("parted", [False, True], ids=["whole", "parted"])
async def test_fields_computed_from_a_step_sent_again_since_are_refused(
    file_or_s3: tuple[str, dict[str, Any]], parted: bool
) -> None:
    url, options = file_or_s3
    await _send(url, options, 0, parted)
    first, first_id = await _read(url, options, parted)
    assert first == [-1, 19] and first_id  # (0, no score; 2, no score)
    await _send(url, options, 10, parted)  # another run: the same shape, other values
    again, again_id = await _read(url, options, parted)
    assert again == [99, 119] and again_id and again_id != first_id

    with pytest.raises(
        rlwire.ConfigError, match=r"not the message the fields were computed"
    ) as caught:
        await _add(url, options, of=first_id)
    # The error names the destination (and the step and rank), not only the step.
    assert url.removeprefix("s3://") in str(caught.value.where)
    assert (caught.value.step, caught.value.rank) == (0, 0)
    assert (await _read(url, options, parted))[0] == [99, 119]  # nothing was stored

    await _add(url, options, of=again_id)
    assert (await _read(url, options, parted))[0] == [107, 128]


async def test_of_must_be_bytes_and_none_ties_to_the_step_as_found(tmp_path: Any) -> None:
    url = str(tmp_path / "run")
    await _send(url, {}, 0, False)
    _, message = await _read(url, {}, False)
    with pytest.raises(rlwire.ConfigError, match="of must be the bytes"):
        await _add(url, {}, of=message.hex())
    await _add(url, {}, of=None)
    assert (await _read(url, {}, False))[0] == [7, 28]


def test_the_sync_sender_takes_of(tmp_path: Any) -> None:
    url = str(tmp_path / "run")
    with rlwire.open_sync_sender(url) as sender:
        sender.send({"samples": [{"token_ids": np.arange(2)}, {"token_ids": np.arange(3)}]})
        with pytest.raises(rlwire.ConfigError, match="not the message"):
            sender.add_fields(0, {"score": [7, 8]}, of=b"\0" * 16)
        with rlwire.open_receiver(url, type=dict, record_consumed=False) as receiver:
            receiver.receive(timeout=10)
            assert receiver.last_stats is not None
            message = receiver.last_stats.message_id
        sender.add_fields(0, {"score": [7, 8]}, of=message)
    with rlwire.open_receiver(url, type=dict) as receiver:
        assert [s["score"] for s in receiver.receive(timeout=10)["samples"]] == [7, 8]


async def test_a_part_gives_its_message_id_and_part_0s_is_the_steps(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """A stage that reads a step part by part passes part 0's message id."""
    url, options = file_or_s3
    await _send(url, options, 0, True)
    _, step_id = await _read(url, options, True)
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, record_consumed=False
    ) as receiver:
        with anyio.fail_after(20):
            parts = [part async for part in receiver.aparts(timeout=20)]
        ended = receiver.last_stats  # once the loop ended: the step's, with part 0's id
    assert [p.index for p in parts] == [0, 1]
    assert parts[0].message_id == step_id and parts[1].message_id not in (b"", step_id)
    assert ended is not None and ended.message_id == step_id
    await _send(url, options, 10, True)
    with pytest.raises(rlwire.ConfigError, match="not the message"):
        await _add(url, options, of=parts[0].message_id)


async def test_a_later_parts_message_id_is_told_from_a_step_sent_again(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    """``of=`` given part 1's message id (the stage should pass part 0's) says so,
    instead of blaming a producer that sent the step again (none did)."""
    url, options = file_or_s3
    await _send(url, options, 0, True)
    async with rlwire.open_receiver(
        url, storage_options=options, type=list, record_consumed=False
    ) as receiver:
        with anyio.fail_after(20):
            parts = [part async for part in receiver.aparts(timeout=20)]
    with pytest.raises(rlwire.ConfigError, match=r"of= is the message_id of part 1 .* part 0's"):
        await _add(url, options, of=parts[1].message_id)
    await _add(url, options, of=parts[0].message_id)
