"""Per-step figures: SendStats from senders, ReceiveStats from receivers."""

from __future__ import annotations

from pathlib import Path

import anyio
import numpy as np
import pytest
from helpers import make_batch

import rlwire

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("compression", [None, "lz4"])
async def test_send_and_receive_stats_agree_with_what_moved(
    tmp_path: Path, compression: str | None
) -> None:
    seen: list[rlwire.SendStats] = []
    per_rank = [make_batch(2, 40_000, seed=r) for r in range(2)]
    for batch in per_rank:
        for sample in batch.samples:
            sample.routed_experts[:] = 7  # compressible, so that lz4 is kept
    async with rlwire.open_sender(
        tmp_path, sidecar="routed_experts", compression=compression, on_stats=seen.append
    ) as sender:
        assert sender.last_stats is None
        await sender.send_ranks(per_rank)
    stats = sender.last_stats
    assert stats is not None and seen == [stats]
    assert (stats.step, stats.ranks, len(stats.bytes_per_rank)) == (0, 2, 2)
    files = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    for rank in range(2):
        stored = sum(size for name, size in files.items() if f"rank-{rank:04d}" in name)
        # The files hold the frame plus a small envelope and alignment padding.
        assert stats.bytes_per_rank[rank] <= stored < stats.bytes_per_rank[rank] + 8192
    sidecars = sum(size for name, size in files.items() if "sidecar" in name)
    assert 0 < stats.sidecar_bytes <= sidecars < stats.sidecar_bytes + 8192
    assert stats.encode_seconds > 0 and stats.write_seconds > 0 and stats.commit_seconds > 0
    assert (stats.compress_seconds > 0) == (compression is not None)
    parts = stats.encode_seconds + stats.compress_seconds + stats.write_seconds
    assert parts + stats.commit_seconds <= stats.total_seconds * 1.01
    assert 0 <= stats.worst_loop_lag_seconds < stats.total_seconds
    assert stats.as_dict()["bytes"] == stats.bytes == sum(stats.bytes_per_rank)
    for rank in range(2):
        with rlwire.open_receiver(tmp_path, rank=rank) as receiver:
            assert receiver.last_stats is None
            receiver.receive(timeout=5)
            got = receiver.last_stats
            assert got is not None and (got.step, got.rank) == (0, rank)
            assert got.bytes == stats.bytes_per_rank[rank]  # the same frame, as sent
            assert got.read_seconds > 0 and got.decode_seconds > 0
            assert (got.decompress_seconds > 0) == (compression is not None)
            inner = got.read_seconds + got.decompress_seconds + got.decode_seconds
            assert inner + got.wait_seconds == pytest.approx(got.total_seconds)


async def test_receive_stats_count_the_wait(tmp_path: Path) -> None:
    async def send_later() -> None:
        await anyio.sleep(0.3)
        async with rlwire.open_sender(tmp_path) as sender:
            await sender.send(make_batch(1))

    with rlwire.open_receiver(tmp_path, poll_interval=0.005) as receiver:
        async with anyio.create_task_group() as tg:
            tg.start_soon(send_later)
            await receiver.areceive(timeout=10)
    stats = receiver.last_stats
    assert stats is not None and stats.wait_seconds >= 0.25
    assert stats.read_seconds < stats.wait_seconds


async def test_a_failing_stats_callback_is_raised_after_the_step_is_sent(tmp_path: Path) -> None:
    def broken(stats: rlwire.SendStats) -> None:
        raise RuntimeError(f"logger down at step {stats.step}")

    async with rlwire.open_sender(tmp_path, on_stats=broken) as sender:
        with pytest.raises(RuntimeError, match="logger down at step 0"):
            await sender.send(make_batch(1))
        assert sender.next_step == 1  # the step was sent before the callback ran
    with rlwire.open_receiver(tmp_path) as receiver:
        assert receiver.poll() is not None


def test_a_stats_callback_that_is_not_callable_is_refused_at_open(tmp_path: Path) -> None:
    for opener in (rlwire.open_sender, rlwire.open_sync_sender):
        with pytest.raises(rlwire.ConfigError, match=r"on_stats must be a callable .* got 3"):
            opener(tmp_path, on_stats=3)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


async def test_prometheus_metrics_count_what_the_stats_say(tmp_path: Path) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from rlwire.metrics import Metrics

    registry = prometheus_client.CollectorRegistry()
    metrics = Metrics(registry=registry, namespace="t")
    async with rlwire.open_sender(
        tmp_path, sidecar="routed_experts", on_stats=metrics.observe_send
    ) as sender:
        for seed in range(3):
            await sender.send(make_batch(2, 1000, seed=seed))
    stats = sender.last_stats
    assert stats is not None
    assert registry.get_sample_value("t_sent_steps_total") == 3
    assert registry.get_sample_value("t_sent_bytes_total") == 3 * stats.bytes
    assert registry.get_sample_value("t_sent_sidecar_bytes_total") == 3 * stats.sidecar_bytes
    assert registry.get_sample_value("t_send_seconds_count", {"phase": "encode"}) == 3
    with rlwire.open_receiver(tmp_path) as receiver:
        metrics.observe_receive(receiver.last_stats)  # None before the first: ignored
        received = 0
        for _ in range(3):
            receiver.receive(timeout=5)
            metrics.observe_receive(receiver.last_stats)
            assert receiver.last_stats is not None
            received += receiver.last_stats.bytes
    assert registry.get_sample_value("t_received_steps_total", {"rank": "0"}) == 3
    assert registry.get_sample_value("t_received_bytes_total", {"rank": "0"}) == received
    assert registry.get_sample_value("t_receive_seconds_count", {"phase": "decode"}) == 3


async def test_a_step_filled_part_by_part_has_one_send_stats_summing_its_parts(
    tmp_path: Path,
) -> None:
    seen: list[rlwire.SendStats] = []
    async with rlwire.open_sender(
        tmp_path, sidecar="routed_experts", on_stats=seen.append
    ) as sender:
        await sender.send(make_batch(2, 1000, seed=0))
        async with sender.open_step(ranks=2) as writer:
            for key in range(4):
                await writer.put(make_batch(1, 1000, seed=key).samples, key=key, rank=key % 2)
        parts = sender.last_stats
        await sender.send(make_batch(2, 1000, seed=9))
    assert [stats.step for stats in seen] == [0, 1, 2]
    assert parts is not None and parts == seen[1]
    assert (parts.step, parts.ranks, len(parts.bytes_per_rank)) == (1, 2, 2)
    files = {p.name: p.stat().st_size for p in tmp_path.iterdir() if "00000001" in p.name}
    for rank in range(2):
        stored = sum(size for name, size in files.items() if f"rank-{rank:04d}" in name)
        # Two parts each: their frames, plus a small envelope and padding per file.
        assert parts.bytes_per_rank[rank] <= stored < parts.bytes_per_rank[rank] + 4 * 8192
    sidecars = sum(size for name, size in files.items() if "sidecar" in name)
    assert 0 < parts.sidecar_bytes <= sidecars
    assert parts.encode_seconds > 0 and parts.write_seconds > 0 and parts.commit_seconds > 0
    phases = parts.encode_seconds + parts.write_seconds + parts.commit_seconds
    assert phases + parts.wait_seconds <= parts.total_seconds * 1.01
    with rlwire.open_receiver(tmp_path, start_step=1) as receiver:
        receiver.receive(timeout=5)
        got = receiver.last_stats
        assert got is not None and got.step == 1 and got.bytes == parts.bytes_per_rank[0]


def test_the_sync_sender_counts_a_step_filled_part_by_part(tmp_path: Path) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from rlwire.metrics import Metrics

    registry = prometheus_client.CollectorRegistry()
    metrics = Metrics(registry=registry, namespace="t")
    with rlwire.open_sync_sender(tmp_path, on_stats=metrics.observe_send) as sender:
        sender.send(make_batch(2, 100))
        whole = sender.last_stats
        with sender.open_step() as writer:
            writer.put(make_batch(1, 100, seed=1).samples, key="a")
            writer.put(make_batch(1, 100, seed=2).samples, key="b")
        parts = sender.last_stats
    assert whole is not None and parts is not None and parts.step == 1
    assert registry.get_sample_value("t_sent_steps_total") == 2
    assert registry.get_sample_value("t_sent_bytes_total") == whole.bytes + parts.bytes


async def test_parts_leave_the_stats_of_each_part_then_of_the_step(tmp_path: Path) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(2, 500, seed=0))
        async with sender.open_step() as writer:
            for key in ("a", "b", "c"):
                await writer.put(make_batch(2, 500, seed=len(key)).samples, key=key)
        sent = sender.last_stats
    assert sent is not None and sent.step == 1
    with rlwire.open_receiver(tmp_path) as receiver:
        await receiver.areceive(timeout=5)
        handed: list[rlwire.ReceiveStats] = []
        async for part in receiver.aparts(timeout=5):
            stats = receiver.last_stats
            assert stats is not None and (stats.step, stats.rank) == (1, 0)
            assert stats.message_id == part.message_id  # of this part, not of step 0
            assert stats.read_seconds > 0 and stats.decode_seconds > 0
            inner = stats.read_seconds + stats.decompress_seconds + stats.decode_seconds
            assert inner + stats.wait_seconds == pytest.approx(stats.total_seconds)
            handed.append(stats)
        assert len(handed) == 3 and sum(s.bytes for s in handed) == sent.bytes
        step = receiver.last_stats  # once parts() ended: the step, its parts summed
        assert step is not None and (step.step, step.bytes) == (1, sent.bytes)
        assert step.message_id == handed[0].message_id  # part 0's, what add_fields(of=) takes
        assert step.decode_seconds == pytest.approx(sum(s.decode_seconds for s in handed))
        assert step.total_seconds >= sum(s.total_seconds for s in handed)


async def test_receive_stats_count_the_bytes_of_appended_fields_read(tmp_path: Path) -> None:
    batch = make_batch(4, 64, seed=0)
    lengths = [len(sample.token_ids) for sample in batch.samples]
    hidden = np.ones((sum(lengths), 500), np.float32)  # 500 floats a token
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(batch)
        await sender.add_fields(0, {"hidden": rlwire.Ragged.from_lengths(hidden, lengths)})
        sent = sender.last_stats
    assert sent is not None
    stored = sum(p.stat().st_size for p in tmp_path.glob("step-00000000.rank-0000.fields-*"))
    assert stored > hidden.nbytes
    with rlwire.open_receiver(tmp_path, record_consumed=False) as receiver:
        got = await receiver.areceive(timeout=5)
        assert got.samples[0].extras["hidden"].shape == (lengths[0], 500)
        stats = receiver.last_stats
        assert stats is not None and stats.bytes > sent.bytes + hidden.nbytes
        # The fields' frame: its file less a small envelope and padding.
        assert sent.bytes + stored - 8192 < stats.bytes <= sent.bytes + stored
    for fields, least, most in (
        (["token_ids"], 0, sent.bytes),  # of the step's own message only
        (["hidden"], hidden.nbytes, sent.bytes + stored),  # and the appended field's
    ):
        with rlwire.open_receiver(tmp_path, record_consumed=False, fields=fields) as receiver:
            await receiver.areceive(timeout=5)
            stats = receiver.last_stats
            assert stats is not None and least < stats.bytes <= most, fields


async def test_a_step_read_by_wait_next_is_not_read_again_in_the_receive_stats(
    tmp_path: Path,
) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send(make_batch(8, 20_000))
    with rlwire.open_receiver(tmp_path, record_consumed=False) as receiver:
        assert await receiver.await_next(timeout=5)
        await anyio.sleep(0.2)  # a read counted in the receive would be older than it
        await receiver.areceive(timeout=5)
        stats = receiver.last_stats
    assert stats is not None
    inner = stats.read_seconds + stats.decompress_seconds + stats.decode_seconds
    assert inner + stats.wait_seconds == pytest.approx(stats.total_seconds)
    assert stats.read_seconds <= stats.total_seconds < 0.2


async def test_a_failing_stats_callback_is_raised_after_a_step_of_parts_is_sealed(
    tmp_path: Path,
) -> None:
    def broken(stats: rlwire.SendStats) -> None:
        raise RuntimeError(f"logger down at step {stats.step}")

    async with rlwire.open_sender(tmp_path, on_stats=broken) as sender:
        with pytest.raises(RuntimeError, match="logger down at step 0"):
            async with sender.open_step() as writer:
                await writer.put(make_batch(1).samples, key="a")
        assert sender.next_step == 1  # sealed before the callback ran
    with rlwire.open_receiver(tmp_path) as receiver:
        assert receiver.poll() is not None
