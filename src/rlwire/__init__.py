"""rlwire: move LLM RL training batches from rollout collectors to trainer ranks, fast.

Example:
    >>> import anyio, numpy as np, rlwire, tempfile
    >>> path = tempfile.mkdtemp()
    >>> async def produce() -> None:
    ...     async with rlwire.open_sender(path, sidecar=("routed_experts",)) as sender:
    ...         await sender.send({"token_ids": np.arange(8)})
    >>> anyio.run(produce)
    >>> with rlwire.open_receiver(path, type=dict) as receiver:
    ...     receiver.receive(timeout=5)["token_ids"].sum()
    np.int64(28)
"""

from ._aio import LagMonitor
from ._sync_sender import SyncSender, open_sync_sender
from .checks import Checks
from .errors import (
    ClosedError,
    ConfigError,
    CorruptFrameError,
    DecodeError,
    EncodeError,
    EndOfStream,
    FrameTooLargeError,
    ReceiveTimeout,
    RlwireError,
    SchemaError,
    StepExistsError,
    StepGapError,
    StepOrderError,
    TransportError,
    UnsupportedVersionError,
)
from .frame import Frame
from .receiver import TrainingBatchReceiver, open_receiver
from .schema import TrainingBatch, TrainingSample
from .sender import TrainingBatchSender, open_sender
from .stats import ReceiveStats, SendStats

__version__ = "0.1.0"

__all__ = [
    "Checks",
    "ClosedError",
    "ConfigError",
    "CorruptFrameError",
    "DecodeError",
    "EncodeError",
    "EndOfStream",
    "Frame",
    "FrameTooLargeError",
    "LagMonitor",
    "ReceiveStats",
    "ReceiveTimeout",
    "RlwireError",
    "SchemaError",
    "SendStats",
    "StepExistsError",
    "StepGapError",
    "StepOrderError",
    "SyncSender",
    "TrainingBatch",
    "TrainingBatchReceiver",
    "TrainingBatchSender",
    "TrainingSample",
    "TransportError",
    "UnsupportedVersionError",
    "open_receiver",
    "open_sender",
    "open_sync_sender",
]
