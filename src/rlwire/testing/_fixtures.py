"""The fixtures and helpers the contract's tests share; :mod:`rlwire.testing` is the face."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import anyio
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.receiver import open_receiver
from rlwire._api.schema import TrainingBatch, TrainingSample
from rlwire._api.sender import open_sender
from rlwire._api.synthetic import make_batch, make_sample

__all__ = [
    "RANKS",
    "TIMEOUT",
    "ContractFixtures",
    "Endpoint",
    "big_batch",
    "rank_batches",
    "receive_beside",
    "send_steps",
    "small_samples",
]

T = TypeVar("T")

#: Seconds a contract test waits for something that should happen, unless its class
#: says otherwise (:attr:`ContractFixtures.timeout`).
TIMEOUT = 30.0

#: Ranks the contract's receivers stand for.
RANKS = 2


@dataclass(frozen=True)
class Endpoint:
    """The sink a contract test runs against: its URL and the storage options of each side."""

    url: str
    sender_options: Mapping[str, Any]
    receiver_options: Mapping[str, Any]

    def open_sender(self, **options: Any) -> TrainingBatchSender:
        """A sender to ``url`` with the sender's storage options and ``options``."""
        return open_sender(self.url, storage_options=self.sender_options, **options)

    def open_receiver(self, **options: Any) -> TrainingBatchReceiver[TrainingBatch]:
        """A receiver of ``url`` with the receivers' storage options and ``options``."""
        return open_receiver(self.url, storage_options=self.receiver_options, **options)


class ContractFixtures:
    """The fixtures of :class:`~rlwire.testing.SinkContract`, which a subclass overrides."""

    #: Steps outlive the sender and can be read, refused, resumed or overwritten later.
    #: Set to False for streams; the tests that need a store are then skipped.
    persistent: ClassVar[bool] = True

    #: Seconds a test waits for something that should happen (a step, a part, the end
    #: of the stream, a send that ``max_ahead`` holds back): a sink that never delivers
    #: it fails the test after this long instead of hanging the run. Raise it for a
    #: slow store.
    timeout: ClassVar[float] = TIMEOUT

    pytestmark = pytest.mark.anyio

    @pytest.fixture(params=["asyncio", "trio"])
    def anyio_backend(self, request: pytest.FixtureRequest) -> str:
        if request.param == "trio":
            pytest.importorskip("trio")
        return str(request.param)

    @pytest.fixture
    def sink_url(self) -> str:
        raise NotImplementedError("a SinkContract subclass must define a sink_url fixture")

    @pytest.fixture
    def sender_options(self) -> Mapping[str, Any]:
        return {}

    @pytest.fixture
    def receiver_options(self) -> Mapping[str, Any]:
        return {}

    @pytest.fixture
    def endpoint(
        self,
        sink_url: str,
        sender_options: Mapping[str, Any],
        receiver_options: Mapping[str, Any],
    ) -> Endpoint:
        return Endpoint(sink_url, sender_options, receiver_options)

    @pytest.fixture
    def store(self, endpoint: Endpoint) -> Endpoint:
        """The endpoint, for a test that needs steps to outlive the sender (skipped else)."""
        if not self.persistent:
            pytest.skip("needs a sink whose steps outlive the sender")
        return endpoint

    @pytest.fixture
    def sender(self, endpoint: Endpoint) -> TrainingBatchSender:
        return endpoint.open_sender(sidecar="routed_experts")

    @pytest.fixture
    def receivers(self, endpoint: Endpoint) -> Iterator[list[TrainingBatchReceiver[TrainingBatch]]]:
        opened = [endpoint.open_receiver(rank=rank) for rank in range(RANKS)]
        yield opened
        for receiver in opened:
            receiver.close()


def small_samples(lengths: Iterable[int], seed: int) -> list[TrainingSample]:
    """A sample of each of ``lengths`` tokens, without a sidecar array (seeded from
    ``seed`` and the sample's place)."""
    return [make_sample(n, seed=seed * 10 + i, routed=False) for i, n in enumerate(lengths)]


def rank_batches(step: int, *, samples: int = 1, seed_stride: int = 10) -> list[TrainingBatch]:
    """One batch per rank for ``step``, each of its own data (seeded
    ``seed_stride * step + rank``)."""
    return [make_batch(samples, seed=seed_stride * step + rank) for rank in range(RANKS)]


async def send_steps(sender: TrainingBatchSender, steps: Iterable[list[TrainingBatch]]) -> None:
    """Send each of ``steps``, one batch per rank, in order."""
    for payloads in steps:
        await sender.send_ranks(payloads)


def big_batch() -> TrainingBatch:
    """About 64 MB, so that a send takes long enough to be cancelled midway."""
    return TrainingBatch(samples=[make_sample(1 << 20, layers=16, topk=2, seed=s) for s in (1, 2)])


async def receive_beside(
    send: Callable[[], Coroutine[Any, Any, object]], receive: Callable[[], Awaitable[T]]
) -> T:
    """What ``receive`` returns, with ``send`` running beside it in a task: a stream may
    wait for its receivers before it sends."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(send)
        got = await receive()
    return got
