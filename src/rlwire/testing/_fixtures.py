"""The fixtures and helpers the contract's tests share; :mod:`rlwire.testing` is the face."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import anyio
import pytest

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.receiver import open_receiver
from rlwire._api.schema import TrainingBatch
from rlwire._api.sender import open_sender
from rlwire._api.synthetic import make_sample

__all__ = ["TIMEOUT", "ContractFixtures", "big_batch", "receive_beside"]

T = TypeVar("T")

#: Seconds a contract test waits for something that should happen.
TIMEOUT = 30.0


class ContractFixtures:
    """The fixtures of :class:`~rlwire.testing.SinkContract`, which a subclass overrides."""

    #: Steps outlive the sender and can be read, refused, resumed or overwritten later.
    #: Set to False for streams; the tests that need a store are then skipped.
    persistent: ClassVar[bool] = True

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
    def sender(self, sink_url: str, sender_options: Mapping[str, Any]) -> TrainingBatchSender:
        return open_sender(sink_url, storage_options=sender_options, sidecar="routed_experts")

    @pytest.fixture
    def receivers(
        self, sink_url: str, receiver_options: Mapping[str, Any]
    ) -> Iterator[list[TrainingBatchReceiver[TrainingBatch]]]:
        opened = [
            open_receiver(sink_url, rank=rank, storage_options=receiver_options)
            for rank in range(2)
        ]
        yield opened
        for receiver in opened:
            receiver.close()

    def _require_store(self) -> None:
        if not self.persistent:
            pytest.skip("needs a sink whose steps outlive the sender")


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
