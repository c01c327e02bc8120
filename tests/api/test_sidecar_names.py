"""A ``sidecar=`` name that matches nothing in the messages sent (``"routed_expert"``
beside a field ``routed_experts``): refused when no message of the types sent can hold
it, warned about once when a dict's keys still could; and ``add_fields`` sending the
fields named in ``sidecar=`` to a sidecar. Real files and the test S3 server; asyncio
and trio."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest
from helpers import plain_sample

import rlwire

pytestmark = pytest.mark.anyio


class RoutedExperts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    data: bytes
    shape: list[int]
    dtype: str


class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    """A framework's own sample: every field known from the type, no dict."""

    input_ids: list[int]
    routed_experts: RoutedExperts | None = None


def _micro(n: int, experts: bool = True) -> MicroBatch:
    routed = RoutedExperts(bytes(n * 8), [n, 4, 2], "uint8") if experts else None
    return MicroBatch(list(range(n)), routed)


def _sample(n: int, experts: bool = True) -> rlwire.TrainingSample:
    return plain_sample(n, (4, 2) if experts else None)


def _stored(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith("step-"))


async def _through(sender: rlwire.TrainingBatchSender, how: str, obj: list[Any]) -> None:
    if how == "send":
        await sender.send(obj)
    elif how == "send_ranks":
        await sender.send_ranks([obj, obj])
    else:
        async with sender.open_step() as writer:
            await writer.put(obj, key="a")


@pytest.mark.parametrize("how", ["send", "send_ranks", "put"])
async def test_a_name_no_struct_of_the_message_holds_is_refused_before_anything_is_written(
    tmp_path: Path, how: str
) -> None:
    async with rlwire.open_sender(tmp_path, sidecar=["routed_expert"]) as sender:
        with pytest.raises(rlwire.ConfigError) as caught:
            await _through(sender, how, [_micro(4)])
        assert sender.next_step == 0
    message = str(caught.value)
    assert "sidecar name 'routed_expert' matches no field or key" in message
    assert "did you mean 'routed_experts'?" in message
    assert "MicroBatch, RoutedExperts" in message and "input_ids" in message
    assert "step 0, rank 0" in message
    assert _stored(tmp_path) == []


def test_the_sync_sender_refuses_it_too(tmp_path: Path) -> None:
    with rlwire.open_sync_sender(tmp_path, sidecar="routed_expert") as sender:
        with pytest.raises(rlwire.ConfigError, match="'routed_expert' matches no field"):
            sender.send([_micro(4)])
        with pytest.raises(rlwire.ConfigError, match="'routed_expert' matches no field"):
            with sender.open_step() as writer:
                writer.put([_micro(4)], key="a")
    assert _stored(tmp_path) == []


async def test_an_optional_field_left_none_is_a_field_all_the_same(tmp_path: Path) -> None:
    """A step whose samples leave ``routed_experts`` None sends nothing to the sidecar,
    and is neither refused nor warned about: the name is a field of the type."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        async with rlwire.open_sender(tmp_path, sidecar=("routed_experts",)) as sender:
            await sender.send([_micro(4, experts=False)])
            await sender.send([_micro(4)])
            await sender.send(rlwire.TrainingBatch(samples=[_sample(3, experts=False)]))
            await sender.send(rlwire.TrainingBatch(samples=[]))
            await sender.send(rlwire.TrainingBatch(samples=[_sample(3)]))
    sidecars = [n for n in _stored(tmp_path) if n.endswith(".sidecar.rlw")]
    assert sidecars == [f"step-0000000{s}.rank-0000.sidecar.rlw" for s in (1, 4)]


async def test_a_name_a_dict_could_still_hold_is_warned_about_once(tmp_path: Path) -> None:
    """TrainingSample's ``extras`` is a dict: a name no field matches may be one of its
    keys in a later step. The step goes, the warning names the name, the names there
    and the closest, once per sender."""
    async with rlwire.open_sender(tmp_path, sidecar=("routed_expert",)) as sender:
        with pytest.warns(rlwire.SidecarWarning) as caught:
            await sender.send(rlwire.TrainingBatch(samples=[_sample(3)]))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await sender.send(rlwire.TrainingBatch(samples=[_sample(3)]))
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "sidecar name 'routed_expert' matched no field or key" in message
    assert "did you mean 'routed_experts'?" in message
    assert "extras" in message and "token_ids" in message
    assert _stored(tmp_path) == ["step-00000000.rank-0000.rlw", "step-00000001.rank-0000.rlw"]


async def test_a_key_of_a_later_step_goes_to_the_sidecar_after_one_warning(
    tmp_path: Path,
) -> None:
    async with rlwire.open_sender(tmp_path, sidecar=("images",)) as sender:
        with pytest.warns(rlwire.SidecarWarning, match="'images' matched no field or key"):
            await sender.send({"token_ids": np.arange(4)})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await sender.send({"token_ids": np.arange(4), "images": np.zeros(10_000)})
            await sender.send({"token_ids": np.arange(4)})  # matched once: settled
    assert "step-00000001.rank-0000.sidecar.rlw" in _stored(tmp_path)


def test_a_warning_made_an_error_refuses_the_step(tmp_path: Path) -> None:
    """Who wants every such name refused filters the warning into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", rlwire.SidecarWarning)
        with rlwire.open_sync_sender(tmp_path, sidecar=("routed_expert",)) as sender:
            with pytest.raises(rlwire.SidecarWarning):
                sender.send(rlwire.TrainingBatch(samples=[_sample(3)]))
    assert _stored(tmp_path) == []


def _names(url: str, options: dict[str, Any]) -> list[str]:
    """What the store holds under ``url``, read from the store itself."""
    if not url.startswith("s3://"):
        return sorted(os.listdir(url))
    from s3_server import s3_client

    bucket, prefix = url.removeprefix("s3://").split("/", 1)
    listed = s3_client(options).list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    return sorted(item["Key"].removeprefix(f"{prefix}/") for item in listed.get("Contents", []))


async def test_add_fields_sends_the_fields_named_in_sidecar_to_a_sidecar(
    file_or_s3: tuple[str, dict[str, Any]],
) -> None:
    url, options = file_or_s3
    values = np.arange(3 * 5000, dtype=np.float32).reshape(3, 5000)
    async with rlwire.open_sender(url, storage_options=options) as sender:
        await sender.send(rlwire.TrainingBatch(samples=[_sample(n) for n in (2, 3, 4)]))
    stage = rlwire.open_sender(url, sidecar=("values",), storage_options=options)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the name matches no step's field: no matter
            await stage.add_fields(0, {"values": values, "score": [1.0, 2.0, 3.0]})
            await stage.add_fields(0, {"other": [1, 2, 3]})
    finally:
        await stage.aclose()
    stored = _names(url, options)
    assert "step-00000000.rank-0000.fields-000.sidecar.rlw" in stored
    assert "step-00000000.rank-0000.fields-001.sidecar.rlw" not in stored
    async with rlwire.open_receiver(url, storage_options=options) as receiver:
        with anyio.fail_after(20):
            got = await receiver.areceive()
    assert [s.extras["values"].tolist() for s in got.samples] == values.tolist()
    assert [float(s.extras["score"]) for s in got.samples] == [1.0, 2.0, 3.0]
    async with rlwire.open_receiver(url, fields=("values",), storage_options=options) as rx:
        with anyio.fail_after(20):
            cols = (await rx.areceive()).samples
    assert np.array_equal(cols["values"].values, values.reshape(-1))
