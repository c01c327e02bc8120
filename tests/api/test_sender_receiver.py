"""The public path end to end on real files: open_sender -> files -> open_receiver."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest
from helpers import assert_batches_equal, make_batch, make_sample

import rlwire
from rlwire.transport._url import local_path, parse_url

pytestmark = pytest.mark.anyio


def visible(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


@pytest.mark.parametrize("sidecar", [None, ("routed_experts",)])
async def test_round_trip(tmp_path: Path, sidecar: tuple[str, ...] | None) -> None:
    batches = [make_batch(3, seed=s) for s in range(3)]
    async with rlwire.open_sender(tmp_path, sidecar=sidecar) as sender:
        for i, batch in enumerate(batches):
            assert await sender.send(batch) == i
        assert sender.last_step == 2 and sender.next_step == 3
    names = visible(tmp_path)
    assert "step-00000002.rank-0000.rlw" in names
    assert ("step-00000000.rank-0000.sidecar.rlw" in names) == bool(sidecar)
    assert not [n for n in names if n.startswith(".")]
    with rlwire.open_receiver(tmp_path) as receiver:
        for i, batch in enumerate(batches):
            got = receiver.receive(timeout=5)
            assert isinstance(got, rlwire.TrainingBatch)
            assert receiver.last_step == i
            assert_batches_equal(got, batch)
        assert receiver.poll() is None


async def test_sidecar_moves_routed_experts_bytes(tmp_path: Path) -> None:
    batch = make_batch(4, n=64)
    expert_bytes = sum(s.routed_experts.nbytes for s in batch.samples)
    async with rlwire.open_sender(tmp_path, sidecar=("routed_experts",)) as sender:
        await sender.send(batch)
    main = (tmp_path / "step-00000000.rank-0000.rlw").stat().st_size
    side = (tmp_path / "step-00000000.rank-0000.sidecar.rlw").stat().st_size
    assert side >= expert_bytes
    assert main < sum(s.token_ids.nbytes * 4 for s in batch.samples) + 64 * 1024
    # the sidecar holds exactly the routed-expert bytes (plus alignment)
    raw = (tmp_path / "step-00000000.rank-0000.sidecar.rlw").read_bytes()
    assert batch.samples[2].routed_experts.tobytes() in raw


async def test_async_receive_and_iteration(tmp_path: Path) -> None:
    batches = [make_batch(2, seed=s) for s in range(3)]
    received: list[rlwire.TrainingBatch] = []

    async def consume() -> None:
        async with rlwire.open_receiver(tmp_path, poll_interval=0.005) as receiver:
            received.append(await receiver.areceive(timeout=10))
            async for batch in receiver:
                received.append(batch)
                if len(received) == 3:
                    break

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        async with rlwire.open_sender(tmp_path) as sender:
            for batch in batches:
                await anyio.sleep(0.02)
                await sender.send(batch)
    for got, want in zip(received, batches, strict=True):
        assert_batches_equal(got, want)


async def test_received_arrays_are_readonly_views(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, sidecar="routed_experts") as sender:
        await sender.send(make_batch(1, n=600))
    with rlwire.open_receiver(tmp_path) as receiver:
        sample = receiver.receive(timeout=5).samples[0]
    re = sample.routed_experts
    assert re is not None
    assert not re.flags.writeable and not re.flags.owndata
    assert re.ctypes.data % 64 == 0  # aligned in the file, so aligned in the mapping
    with pytest.raises(ValueError):
        re[0, 0, 0] = 1


async def test_writable_receive_does_not_touch_the_file(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(1, n=600))
    with rlwire.open_receiver(tmp_path, writable=True) as receiver:
        ids = receiver.receive(timeout=5).samples[0].token_ids
    original = ids.copy()
    ids[:] = -1
    with rlwire.open_receiver(tmp_path) as receiver:
        assert (receiver.receive(timeout=5).samples[0].token_ids == original).all()


async def test_send_ranks(tmp_path: Path) -> None:
    per_rank = [make_batch(2, seed=10 * r) for r in range(3)]
    async with rlwire.open_sender(tmp_path, sidecar=("routed_experts",)) as sender:
        assert await sender.send_ranks(per_rank) == 0
    for rank, want in enumerate(per_rank):
        with rlwire.open_receiver(tmp_path, rank=rank) as receiver:
            assert_batches_equal(receiver.receive(timeout=5), want)


async def test_send_ranks_error_names_rank_and_writes_nothing(tmp_path: Path) -> None:
    bad = make_batch(2)
    bad.samples[1].logprobs[3] = np.nan
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(rlwire.SchemaError, match=r"rank 1: .*samples\[1\]\.logprobs"):
            await sender.send_ranks([make_batch(2), bad])
        assert sender.next_step == 0
    assert visible(tmp_path) == []


class ListingCodec:
    """The msgpack codec, noting what the destination holds as each object is encoded."""

    name = "msgpack"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.inner = rlwire.codecs.make_codec("msgpack")
        self.seen: list[list[str]] = []

    def encode_sliced(self, obj: Any) -> Any:
        self.seen.append(visible(self.path))
        return (yield from self.inner.encode_sliced(obj))

    def decode(self, frame: rlwire.Frame, type: Any = Any, *, writable: bool = False) -> Any:
        return self.inner.decode(frame, type, writable=writable)


async def test_send_ranks_writes_each_rank_before_encoding_the_next(tmp_path: Path) -> None:
    # Only one rank's encoded message is held at a time: rank r is encoded after rank
    # r - 1 is written (under a temporary name, still invisible).
    codec = ListingCodec(tmp_path)
    per_rank = [make_batch(2, seed=r) for r in range(3)]
    async with rlwire.open_sender(tmp_path, codec=codec) as sender:
        await sender.send_ranks(per_rank)
    assert [len(names) for names in codec.seen] == [0, 1, 2]
    assert all(name.startswith(".") for names in codec.seen for name in names)
    for rank, want in enumerate(per_rank):
        with rlwire.open_receiver(tmp_path, rank=rank) as receiver:
            assert_batches_equal(receiver.receive(timeout=5), want)


class ExpertIds(msgspec.Struct):
    data: bytes
    shape: tuple[int, ...]


class Rollout(msgspec.Struct):
    prompt: str
    token_ids: np.ndarray
    routed_experts: ExpertIds
    meta: dict[str, Any] = {}


async def test_user_struct_with_nested_sidecar_bytes(tmp_path: Path) -> None:
    experts = np.arange(24, dtype=np.uint8).reshape(4, 3, 2)
    obj = Rollout("hi", np.arange(4), ExpertIds(experts.tobytes(), experts.shape), {"k": [1, 2]})
    async with rlwire.open_sender(tmp_path, sidecar=["routed_experts"]) as sender:
        await sender.send(obj)
    assert experts.tobytes() in (tmp_path / "step-00000000.rank-0000.sidecar.rlw").read_bytes()
    with rlwire.open_receiver(tmp_path, type=Rollout) as receiver:
        got = receiver.receive(timeout=5)
    assert got.prompt == "hi" and got.meta == {"k": [1, 2]}
    assert got.routed_experts == obj.routed_experts
    assert (got.token_ids == obj.token_ids).all()


async def test_untyped_receive_gives_plain_containers(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send({"a": np.arange(5000), "b": [1, "x"]})
    with rlwire.open_receiver(f"file://{tmp_path}", type=Any) as receiver:
        got = receiver.receive(timeout=5)
    assert got["b"] == [1, "x"] and got["a"].sum() == np.arange(5000).sum()


# -- steps -----------------------------------------------------------------------------


async def test_step_order_errors(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        assert await sender.send(make_batch(1), step=5) == 5  # a fresh run may start anywhere
        with pytest.raises(rlwire.StepOrderError, match="step 5 repeats step 5"):
            await sender.send(make_batch(1), step=5)
        with pytest.raises(rlwire.StepOrderError, match="goes backwards"):
            await sender.send(make_batch(1), step=2)
        with pytest.raises(rlwire.StepOrderError, match="skips ahead of step 6"):
            await sender.send(make_batch(1), step=8)
        with pytest.raises(
            rlwire.StepOrderError, match="step must be an int from 0 to 18446744073709551614"
        ):
            await sender.send(make_batch(1), step=-1)
        assert await sender.send(make_batch(1)) == 6
    assert visible(tmp_path) == ["step-00000005.rank-0000.rlw", "step-00000006.rank-0000.rlw"]


async def test_existing_steps_are_refused_by_default(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(1))
        await sender.send(make_batch(1))
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    with pytest.raises(rlwire.StepExistsError, match=r"holds steps 0\.\.1 .*on_existing"):
        async with rlwire.open_sender(tmp_path) as sender:
            pass
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


async def test_overwrite_clears_earlier_steps(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, sidecar="routed_experts") as sender:
        for _ in range(3):
            await sender.send(make_batch(1, seed=1))
    new = make_batch(1, seed=2)
    async with rlwire.open_sender(tmp_path, on_existing="overwrite") as sender:
        await sender.send(new)
    assert visible(tmp_path) == ["fence.rlw", "step-00000000.rank-0000.rlw"]  # no step 1, 2
    with rlwire.open_receiver(tmp_path) as receiver:
        assert_batches_equal(receiver.receive(timeout=5), new)


async def test_resume_continues_after_last_step(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(1))
    async with rlwire.open_sender(tmp_path, on_existing="resume") as sender:
        assert sender.next_step == 1
        with pytest.raises(rlwire.StepOrderError):
            await sender.send(make_batch(1), step=0)
        assert await sender.send(make_batch(1)) == 1


async def test_step_that_appears_at_destination_is_refused(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        (tmp_path / "step-00000000.rank-0000.rlw").write_bytes(b"from someone else")
        with pytest.raises(rlwire.StepExistsError, match="step 0 rank 0 already exists"):
            await sender.send(make_batch(1))
    assert (tmp_path / "step-00000000.rank-0000.rlw").read_bytes() == b"from someone else"


async def test_invalid_on_existing(tmp_path: Path) -> None:
    with pytest.raises(rlwire.ConfigError, match="on_existing"):
        rlwire.open_sender(tmp_path, on_existing="append")  # type: ignore[arg-type]


# -- bad input: typed errors, nothing visible, no temporary files ------------------------


def _nan_logprobs() -> rlwire.TrainingBatch:
    b = make_batch(3)
    b.samples[2].logprobs[4] = np.nan
    return b


def _inf_advantages() -> rlwire.TrainingBatch:
    b = make_batch(3)
    b.samples[1].advantages[0] = -np.inf
    return b


def _short_mask() -> rlwire.TrainingBatch:
    b = make_batch(2)
    b.samples[1].mask = b.samples[1].mask[:-1]
    return b


def _list_not_array() -> rlwire.TrainingBatch:
    b = make_batch(2)
    b.samples[0].logprobs = [0.0] * len(b.samples[0].token_ids)  # type: ignore[assignment]
    return b


def _float_token_ids() -> rlwire.TrainingBatch:
    b = make_batch(2)
    b.samples[1].token_ids = b.samples[1].token_ids.astype(np.float64)
    return b


def _misaligned_experts() -> rlwire.TrainingBatch:
    b = make_batch(2)
    assert b.samples[1].routed_experts is not None
    b.samples[1].routed_experts = b.samples[1].routed_experts[1:]
    return b


def _wide_expert_ids() -> rlwire.TrainingBatch:
    b = make_batch(2)
    assert b.samples[0].routed_experts is not None
    b.samples[0].routed_experts = b.samples[0].routed_experts.astype(np.int64)
    return b


def _object_extras() -> rlwire.TrainingBatch:
    b = make_batch(2)
    b.samples[1].extras["reward_info"] = np.array([{"a": 1}], dtype=object)
    return b


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (_nan_logprobs, rlwire.SchemaError, r"samples\[2\]\.logprobs: 1 non-finite value .* 4"),
        (_inf_advantages, rlwire.SchemaError, r"samples\[1\]\.advantages: 1 non-finite"),
        (_short_mask, rlwire.SchemaError, r"samples\[1\]\.mask: has 16 entries .* 17"),
        (_list_not_array, rlwire.SchemaError, r"samples\[0\]\.logprobs: expected a numpy array"),
        (_float_token_ids, rlwire.SchemaError, r"samples\[1\]\.token_ids: .*integers"),
        (_misaligned_experts, rlwire.SchemaError, r"samples\[1\]\.routed_experts: has 16 rows"),
        (_wide_expert_ids, rlwire.SchemaError, r"samples\[0\]\.routed_experts: must be uint8"),
        (_object_extras, rlwire.EncodeError, r"samples\[1\]\.extras\.reward_info: .*object"),
    ],
)
@pytest.mark.parametrize("sidecar", [None, ("routed_experts",)])
async def test_bad_input_is_refused_before_anything_is_written(
    tmp_path: Path,
    make: Any,
    error: type[Exception],
    match: str,
    sidecar: tuple[str, ...] | None,
) -> None:
    async with rlwire.open_sender(tmp_path, sidecar=sidecar) as sender:
        with pytest.raises(error, match=match) as info:
            await sender.send(make())
        assert isinstance(info.value, rlwire.RlwireError)
        assert visible(tmp_path) == []
        assert await sender.send(make_batch(1)) == 0  # the failed step was not used up


async def test_validation_can_be_switched_off(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, validate=False) as sender:
        await sender.send(_nan_logprobs())
    with rlwire.open_receiver(tmp_path) as receiver:
        assert np.isnan(receiver.receive(timeout=5).samples[2].logprobs[4])
    with (
        rlwire.open_receiver(tmp_path, validate=True) as receiver,
        pytest.raises(rlwire.SchemaError, match=r"step 0\.samples\[2\]\.logprobs"),
    ):
        receiver.receive(timeout=5)


async def test_send_after_close(tmp_path: Path) -> None:
    sender = rlwire.open_sender(tmp_path)
    async with sender:
        await sender.send(make_batch(1))
    with pytest.raises(rlwire.ClosedError):
        await sender.send(make_batch(1))
    await sender.aclose()  # idempotent


async def test_unwritable_destination(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(rlwire.TransportError, match="a-file") as info:
        async with rlwire.open_sender(blocker / "steps") as sender:
            await sender.send(make_batch(1))
    assert isinstance(info.value, OSError)


async def test_destination_removed_mid_run(tmp_path: Path) -> None:
    target = tmp_path / "steps"
    async with rlwire.open_sender(target) as sender:
        await sender.send(make_batch(1))
        for p in target.iterdir():
            p.unlink()
        target.rmdir()
        with pytest.raises(rlwire.TransportError, match="cannot create a file"):
            await sender.send(make_batch(1))
        assert sender.next_step == 1
    assert not target.exists()


async def test_unknown_url_scheme(tmp_path: Path) -> None:
    with pytest.raises(rlwire.ConfigError, match=r"unknown URL scheme 'nope'.*file"):
        rlwire.open_sender("nope://bucket/x")
    with pytest.raises(rlwire.ConfigError, match="host"):
        rlwire.open_receiver("file://otherhost/x")


async def test_cancelled_send_leaves_nothing_half_visible(tmp_path: Path) -> None:
    big = rlwire.TrainingBatch(
        samples=[make_sample(4096, layers=64, topk=8, seed=i) for i in range(24)]
    )  # ~50 MB
    cancelled_midway = 0
    async with rlwire.open_sender(
        tmp_path, sidecar="routed_experts", on_existing="overwrite"
    ) as sender:
        for delay in (0.0, 0.001, 0.003, 0.01, 0.03):
            before = sender.next_step
            with anyio.move_on_after(delay) as scope:
                await sender.send(big)
            names = visible(tmp_path)
            assert not [n for n in names if n.startswith(".")], names  # no temporary files
            if scope.cancelled_caught and sender.next_step == before:
                cancelled_midway += 1
                assert f"step-{before:08d}.rank-0000.rlw" not in names
                assert f"step-{before:08d}.rank-0000.sidecar.rlw" not in names
            else:
                assert sender.next_step == before + 1
                assert f"step-{before:08d}.rank-0000.rlw" in names
    assert cancelled_midway >= 1
    with rlwire.open_receiver(tmp_path) as receiver:
        for _ in range(sender.next_step):
            assert_batches_equal(receiver.receive(timeout=5), big)


# -- receiving side ----------------------------------------------------------------------


async def test_receive_timeout(tmp_path: Path) -> None:
    with rlwire.open_receiver(tmp_path, poll_interval=0.01) as receiver:
        assert receiver.poll() is None
        with pytest.raises(rlwire.ReceiveTimeout, match="step 0 did not arrive"):
            receiver.receive(timeout=0.05)
        with pytest.raises(rlwire.ReceiveTimeout):
            await receiver.areceive(timeout=0.05)
        assert receiver.next_step == 0
    with pytest.raises(rlwire.ClosedError):
        receiver.poll()


@pytest.mark.parametrize("damage", ["truncate", "garble", "empty", "extend"])
async def test_damaged_file_gives_typed_error(tmp_path: Path, damage: str) -> None:
    async with rlwire.open_sender(tmp_path, sidecar="routed_experts") as sender:
        await sender.send(make_batch(2, n=800))
    main = tmp_path / "step-00000000.rank-0000.rlw"
    data = bytearray(main.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "garble":
        data[20:40] = os.urandom(20)
    elif damage == "empty":
        data = bytearray()
    else:
        data += b"\0" * 10
    main.write_bytes(bytes(data))
    with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match=re.escape(str(main))):
            receiver.receive(timeout=5)
        assert receiver.next_step == 0


async def test_missing_or_stale_sidecar(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path, sidecar="routed_experts") as sender:
        await sender.send(make_batch(1), step=0)
        await sender.send(make_batch(1), step=1)
    side0 = tmp_path / "step-00000000.rank-0000.sidecar.rlw"
    side1 = tmp_path / "step-00000001.rank-0000.sidecar.rlw"
    os.replace(side1, side0)  # step 0 now has step 1's sidecar; step 1 has none
    with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match="another message"):
            receiver.receive(timeout=5)
    with rlwire.open_receiver(tmp_path, start_step=1) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match="missing"):
            receiver.receive(timeout=5)


async def test_received_type_mismatch(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send({"samples": [{"token_ids": "not an array"}]})
    with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.DecodeError, match="TrainingBatch"):
            receiver.receive(timeout=5)


async def test_work_runs_in_threads_under_the_given_limiter(tmp_path: Path) -> None:
    limiter = anyio.CapacityLimiter(1)
    seen: set[int] = set()
    done = anyio.Event()

    async def watch() -> None:
        while not done.is_set():
            seen.add(limiter.borrowed_tokens)
            await anyio.sleep(0)

    batch = rlwire.TrainingBatch(samples=[make_sample(2048, layers=32, seed=i) for i in range(8)])
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        async with rlwire.open_sender(tmp_path, limiter=limiter, sidecar="routed_experts") as s:
            await s.send(batch)
        done.set()
    assert 1 in seen  # the sender's threads borrowed the caller's limiter
    assert limiter.borrowed_tokens == 0


async def test_batch_of_non_samples_is_refused(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(rlwire.SchemaError, match=r"\$\.samples\[1\]: expected TrainingSample"):
            await sender.send(rlwire.TrainingBatch(samples=[make_sample(), {"x": 1}]))  # type: ignore[list-item]
    assert visible(tmp_path) == []


async def test_receiver_can_skip_a_damaged_step(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(1, seed=0))
        await sender.send(make_batch(1, seed=1))
    (tmp_path / "step-00000000.rank-0000.rlw").write_bytes(b"garbage")
    with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.CorruptFrameError):
            receiver.receive(timeout=5)
        assert receiver.skip() == 0
        assert_batches_equal(receiver.receive(timeout=5), make_batch(1, seed=1))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda p: rlwire.open_sender(p, limiter=0),
            r"limiter \(a CapacityLimiter.*must be",
        ),
        (
            lambda p: rlwire.open_receiver(p, limiter=-1),
            r"limiter \(a CapacityLimiter.*must be",
        ),
        (lambda p: rlwire.open_sender(123), "expected a path or URL"),
        (lambda p: rlwire.open_sender(p, sidecar=[1]), "sidecar names"),
        (lambda p: rlwire.open_sender(p, inline_threshold="x"), "inline_threshold"),
        (lambda p: rlwire.open_receiver(p, rank=-1), "rank must be an int of at least 0"),
        (lambda p: rlwire.open_receiver(p, start_step=1.5), "start_step must be"),
        (lambda p: rlwire.open_receiver(p, poll_interval=0), "poll_interval"),
        (lambda p: rlwire.open_receiver(p, record_consumed="no"), "record_consumed must be True"),
        (lambda p: rlwire.open_receiver(p, verify=None), "verify must be True or False"),
        (lambda p: rlwire.open_receiver(p, writable=1), "writable must be True or False"),
        (lambda p: rlwire.open_receiver(p, as_columns="x"), "as_columns must be True or False"),
        (
            lambda p: rlwire.open_receiver(p, type="TrainingBatch"),
            r"type must be what to decode each message into .* got 'TrainingBatch'",
        ),
    ],
)
async def test_bad_options_are_config_errors(tmp_path: Path, call: Any, match: str) -> None:
    with pytest.raises(rlwire.ConfigError, match=match):
        call(tmp_path)


async def test_plain_path_with_a_colon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with rlwire.open_sender("run:1") as sender:
        await sender.send({"a": 1})
    assert (tmp_path / "run:1" / "step-00000000.rank-0000.rlw").exists()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("memory://run[x]", "'x' does not appear to be an IPv4 or IPv6 address"),
        ("s3://bucket[/prefix", "Invalid IPv6 URL"),
        ("zmq+tcp://[bad]:5555", "'bad' does not appear to be an IPv4 or IPv6 address"),
    ],
)
async def test_a_url_urllib_cannot_split_is_a_config_error(url: str, match: str) -> None:
    # urllib takes brackets in a host for an IPv6 address and raised a bare ValueError.
    for call in (rlwire.open_sender, rlwire.open_sync_sender, rlwire.open_receiver):
        with pytest.raises(rlwire.ConfigError, match=rf"^{re.escape(url)}: malformed URL: {match}"):
            call(url)


def test_a_plain_path_urllib_cannot_split_is_still_a_path() -> None:
    # "//host[x]/run" is a POSIX path; urllib reads "host[x]" as a host and refuses it.
    url = parse_url("//host[x]/run")
    assert (url.scheme, local_path(url)) == ("file", "//host[x]/run")


@pytest.mark.parametrize("url", ["", "file://", "file://localhost"])
async def test_a_url_that_names_no_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    # An unset RUN_DIR must not make the current directory the destination.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(rlwire.ConfigError, match=f"{url!r}: names no directory"):
        rlwire.open_sender(url)
    with pytest.raises(rlwire.ConfigError, match=f"{url!r}: names no directory"):
        rlwire.open_receiver(url)
    assert list(tmp_path.iterdir()) == []


async def test_a_path_that_names_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    """A plain path or file:// URL naming a regular file is a mistake in the
    configuration, as an fsspec URL naming an object is: a ConfigError naming the URL
    and the file, from the sender (sync and async) and the receiver (sync and async),
    before anything is written. It was a TransportError ('cannot write to the
    destination directory: File exists'; a receiver's 'cannot open: Not a directory' of
    a file inside it). A path under a regular file stays a TransportError (the store
    cannot write there: test_unwritable_destination)."""
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"hi")
    for url in (str(notes), notes.as_uri()):
        pattern = re.escape(f"{url!r}: {notes} is a regular file, not a directory")
        with pytest.raises(rlwire.ConfigError, match=pattern):
            with rlwire.open_sync_sender(url) as sync_sender:
                sync_sender.send({"x": [1]})
        with pytest.raises(rlwire.ConfigError, match=pattern):
            async with rlwire.open_sender(url) as sender:
                await sender.send({"x": [1]})
        with pytest.raises(rlwire.ConfigError, match=pattern):
            with rlwire.open_receiver(url) as receiver:
                receiver.receive(timeout=1)
        with pytest.raises(rlwire.ConfigError, match=pattern):
            async with rlwire.open_receiver(url, record_consumed=False) as receiver:
                await receiver.areceive(timeout=1)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert notes.read_bytes() == b"hi"


@pytest.mark.parametrize("tail", ["?recycle=1", "#run", "?"])
async def test_a_file_url_with_a_query_or_fragment_is_refused(tmp_path: Path, tail: str) -> None:
    # They were dropped: file:///dir?recycle=1 wrote to dir, without the option.
    url = (tmp_path / "run").as_uri() + tail
    if tail == "?":  # an empty query is no query
        async with rlwire.open_sender(url) as sender:
            await sender.send({"a": 1})
        assert (tmp_path / "run" / "step-00000000.rank-0000.rlw").exists()
        return
    with pytest.raises(rlwire.ConfigError, match="no host, query or fragment"):
        rlwire.open_sender(url)
    with pytest.raises(rlwire.ConfigError, match="no host, query or fragment"):
        rlwire.open_receiver(url)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("start_step", [-1, 2**64 - 1, 2**64, 2**70])
def test_a_start_step_out_of_the_format_range_is_refused(tmp_path: Path, start_step: int) -> None:
    """Steps are stored as u64 and the end mark is the step after the last: a sender
    starts from 0 to 2**64 - 2, else ConfigError names the range, before anything is
    written (open_sync_sender starts no thread)."""
    message = r"start_step must be an int from 0 to 18446744073709551614 \(2\*\*64 - 2: steps"
    for open_ in (rlwire.open_sender, rlwire.open_sync_sender):
        with pytest.raises(rlwire.ConfigError, match=message):
            open_(tmp_path / "run", start_step=start_step)
    assert not (tmp_path / "run").exists()


def test_the_last_start_step_in_range_sends_and_finishes(tmp_path: Path) -> None:
    with rlwire.open_sync_sender(tmp_path, start_step=2**64 - 2) as sender:
        assert sender.send(make_batch()) == 2**64 - 2
        sender.finish()
    with rlwire.open_receiver(tmp_path, start_step=2**64 - 2) as receiver:
        assert_batches_equal(receiver.receive(timeout=5), make_batch())
        with pytest.raises(rlwire.EndOfStream):
            receiver.receive(timeout=5)


def test_a_sender_refuses_steps_past_the_last_one_a_destination_can_hold(tmp_path: Path) -> None:
    with rlwire.open_sync_sender(tmp_path / "near", start_step=2**64 - 2) as sender:
        sender.send(make_batch())
        with pytest.raises(rlwire.StepOrderError, match=r"step must be an int from 0 to 1844"):
            sender.send(make_batch())  # 2**64 - 1: its end mark could not be stored
        sender.finish()
    for step in (2**64 - 1, 2**64):
        with rlwire.open_sync_sender(tmp_path / str(step)) as sender:
            with pytest.raises(rlwire.StepOrderError, match=r"stored as u64"):
                sender.send(make_batch(), step=step)
        assert not list((tmp_path / str(step)).glob("step-*"))


@pytest.mark.parametrize("sidecar", [None, ("routed_experts",)])
async def test_a_batch_sent_packed_arrives_as_its_samples(
    tmp_path: Path, sidecar: tuple[str, ...] | None
) -> None:
    """TrainingBatch(samples=Columns) is checked by column and sent without a gather; a
    receiver asking for TrainingBatch gets the samples, one asking for columns the
    Columns. A packed batch that breaks a rule is refused, naming the sample, and leaves
    nothing behind."""
    batch = make_batch(5, n=7)
    names = [f for f in rlwire.TrainingSample.__struct_fields__ if f not in ("env_name", "extras")]
    columns: dict[str, Any] = {
        name: rlwire.Ragged.from_arrays([getattr(s, name) for s in batch.samples])
        for name in names
        if name != "ref_logprobs"
    }
    columns["env_name"] = [s.env_name for s in batch.samples]
    packed = rlwire.TrainingBatch(samples=rlwire.Columns(columns))  # type: ignore[arg-type]
    bad_logprobs = columns["logprobs"].values.copy()
    bad_logprobs[int(columns["logprobs"].offsets[3]) + 2] = np.inf
    bad = rlwire.TrainingBatch(
        samples=rlwire.Columns(  # type: ignore[arg-type]
            {**columns, "logprobs": rlwire.Ragged(bad_logprobs, columns["logprobs"].offsets)}
        )
    )
    async with rlwire.open_sender(tmp_path, sidecar=sidecar) as sender:
        assert await sender.send(packed) == 0
        with pytest.raises(rlwire.SchemaError, match=r"samples\[3\]\.logprobs: .*token 2"):
            await sender.send(bad)
    assert not any(n.startswith("step-00000001") or n.startswith(".") for n in visible(tmp_path))
    with rlwire.open_receiver(tmp_path) as receiver:
        assert_batches_equal(await receiver.areceive(timeout=5), batch)
    with rlwire.open_receiver(tmp_path, as_columns=True) as receiver:
        got = (await receiver.areceive(timeout=5)).samples
        assert isinstance(got, rlwire.Columns) and len(got) == 5
        assert got["token_ids"].offsets.tolist() == columns["token_ids"].offsets.tolist()
