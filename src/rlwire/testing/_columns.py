"""The contract on columns: lists of samples, ragged and chunked arrays, through the sink.

A list of Structs or dicts holding arrays is stored column by column, large rows as the
runs of a :class:`~rlwire.abc.Pieces`; a :class:`~rlwire.Ragged` as values plus offsets;
a :class:`~rlwire.Chunked` as its chunks back to back. Hypothesis draws mixes of fields,
dtypes, lengths (0 included), missing fields and rows that break their column's pattern,
and each draw goes through the real sender, the sink and its source, and the real
receiver: typed (the same types back) on rank 0, with ``as_columns=True`` on rank 1.

Hypothesis would build every fixture anew for each example if it drove the test itself,
so it runs in a worker thread instead, inside one test: the sender and receivers are
opened once, and each example is one step, sent and received on the event loop through
:func:`anyio.from_thread.run`. A stream is used as in production, step after step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import numpy as np
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.schema import TrainingBatch
from rlwire._api.synthetic import assert_batches_equal
from rlwire._core.columns import Columns
from rlwire._core.errors import RlwireError
from rlwire._core.ragged import Ragged
from rlwire.testing._fixtures import ContractFixtures, Endpoint, small_samples

__all__ = ["ColumnsContract"]


async def _round_trip(
    sender: TrainingBatchSender,
    receivers: list[TrainingBatchReceiver[Any]],
    value: Any,
    timeout: float,
) -> list[Any]:
    """``value`` sent as one step to every rank, and what each rank received or the
    error it raised. A rank that fails moves past the step, so that the next example
    starts in step (else one failure would fail every example after it, and hypothesis
    would shrink to the wrong one)."""
    got: list[Any] = [None] * len(receivers)

    async def take(rank: int) -> None:
        receiver = receivers[rank]
        step = receiver.next_step
        try:
            got[rank] = await receiver.areceive(timeout=timeout)
        except RlwireError as exc:
            got[rank] = exc
            if receiver.next_step == step:  # a store keeps what failed: move past it
                receiver.skip()

    async with anyio.create_task_group() as tg:
        for rank in range(len(receivers)):
            tg.start_soon(take, rank)
        await sender.send_ranks([value] * len(receivers))
    return got


async def _sent_once(
    endpoint: Endpoint, value: Any, type_: Any, timeout: float, **options: Any
) -> tuple[Any, Any]:
    """``value`` sent as one step by a sender opened with ``options``, and what rank 0
    received as ``type_`` and rank 1 as columns; raises what either rank raised."""
    sender = endpoint.open_sender(**options)
    typed = endpoint.open_receiver(rank=0, type=type_, record_consumed=False)
    packed = endpoint.open_receiver(rank=1, type=type_, as_columns=True, record_consumed=False)
    try:
        async with sender:
            got = await _round_trip(sender, [typed, packed], value, timeout)
    finally:
        typed.close()
        packed.close()
    for received in got:
        if isinstance(received, RlwireError):
            raise received
    return got[0], got[1]


class ColumnsContract(ContractFixtures):
    """Columnar values of any mix round-trip, received typed and as columns."""

    #: How many values hypothesis draws for each backend (each is one step). A slow
    #: sink may lower it; running the contract with more finds rarer mixes.
    columns_examples: ClassVar[int] = 20

    async def test_columns_of_any_mix_round_trip(self, endpoint: Endpoint) -> None:
        pytest.importorskip("hypothesis")
        from hypothesis import HealthCheck, given, settings

        from rlwire.testing import _rows

        # Every array its own buffer, even a small one: the sink moves them all (large
        # rows as Pieces; the grid in the sidecar), not just a header.
        sender = endpoint.open_sender(inline_threshold=0, sidecar="grid", checksum=True)
        # No consumption marks: the retention contract tests them, and here they would
        # only add a write per step and rank.
        typed = endpoint.open_receiver(rank=0, type=_rows.Case, record_consumed=False)
        packed = endpoint.open_receiver(rank=1, type=Any, as_columns=True, record_consumed=False)

        @settings(
            max_examples=self.columns_examples,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(_rows.specs())
        def columns_round_trip(spec: _rows.Spec) -> None:
            sent = _rows.build(spec)
            got, columns = anyio.from_thread.run(
                _round_trip, sender, [typed, packed], sent, self.timeout
            )
            for received in (got, columns):
                if isinstance(received, RlwireError):
                    raise received
            _rows.assert_typed(got, sent)
            _rows.assert_as_columns(columns, sent)

        try:
            async with sender:
                await anyio.to_thread.run_sync(columns_round_trip)
        finally:
            typed.close()
            packed.close()

    async def test_a_step_of_many_small_samples_round_trips(self, endpoint: Endpoint) -> None:
        """Thousands of small samples: each per-token column is copied back to back in
        groups, sent as the runs of one buffer (several MiB, runs of other lengths than
        the rows'), and arrives whole, typed on rank 0 and as columns on rank 1."""
        batch = TrainingBatch(samples=small_samples([50 + i % 201 for i in range(3000)], 5))
        got, columns = await _sent_once(endpoint, batch, TrainingBatch, self.timeout, checksum=True)
        assert_batches_equal(got, batch)
        assert isinstance(columns.samples, Columns)
        for name in ("token_ids", "mask", "logprobs", "temperatures", "advantages"):
            column = columns.samples[name]
            assert isinstance(column, Ragged), name
            want = np.concatenate([getattr(s, name) for s in batch.samples])
            assert column.values.tobytes() == want.tobytes(), name

    async def test_array_columns_arrive_with_their_dtype_and_shape(
        self, endpoint: Endpoint
    ) -> None:
        """A numpy column of a Columns (one value a row) is one array: it arrives as
        sent as columns, out-of-band, inline or in the sidecar, and as Python numbers
        (a 1-D column) or row views in rows."""
        n = 300
        sent = {
            "rows": Columns(
                {
                    "reward": np.linspace(-1, 1, n, dtype=np.float32),  # 1.2 kB: inline
                    "seed": np.full(n, 2**63 + 5, np.uint64),
                    "hidden": np.arange(n * 64, dtype=np.float16).reshape(n, 64),
                    "ids": Ragged.from_lengths(np.arange(2 * n, dtype=np.int32), [2] * n),
                }
            )
        }
        rows, columns = await _sent_once(
            endpoint,
            sent,
            Any,
            self.timeout,
            inline_threshold=4096,
            sidecar="hidden",
            checksum=True,
        )
        for name in ("reward", "seed", "hidden"):
            want, got = sent["rows"][name], columns["rows"][name]
            assert isinstance(want, np.ndarray) and isinstance(got, np.ndarray), name
            assert (got.dtype, got.shape) == (want.dtype, want.shape), name
            assert got.tobytes() == want.tobytes(), name
        assert [type(r["reward"]) for r in rows["rows"][:2]] == [float, float]
        assert rows["rows"][7]["seed"] == 2**63 + 5
        assert rows["rows"][7]["hidden"].tobytes() == sent["rows"]["hidden"][7].tobytes()
