"""rlwire: move LLM RL training batches from rollout collectors to trainer ranks, fast.

Example:
    >>> import anyio, numpy as np, rlwire, tempfile
    >>> path = tempfile.mkdtemp()
    >>> async def produce() -> None:
    ...     async with rlwire.open_sender(path, sidecar=("routed_experts",)) as sender:
    ...         experts = np.zeros((8, 4, 2), np.uint8)  # travels raw, in a sidecar file
    ...         await sender.send({"token_ids": np.arange(8), "routed_experts": experts})
    >>> anyio.run(produce)
    >>> with rlwire.open_receiver(path, type=dict) as receiver:
    ...     receiver.receive(timeout=5)["token_ids"].sum()
    np.int64(28)
"""

from rlwire._api.batch_receiver import TrainingBatchReceiver
from rlwire._api.batch_sender import TrainingBatchSender
from rlwire._api.manifest import Manifest, ManifestColumn
from rlwire._api.options import Integrity, Limits, Retention
from rlwire._api.parts import Part
from rlwire._api.receiver import open_receiver
from rlwire._api.schema import TrainingBatch, TrainingSample
from rlwire._api.sender import open_sender
from rlwire._api.stats import ReceiveStats, SendStats
from rlwire._api.step_writer import StepWriter
from rlwire._api.sync_sender import SyncSender, open_sync_sender
from rlwire._api.sync_step_writer import SyncStepWriter
from rlwire._checks.checks import Checks
from rlwire._core.chunked import Chunked
from rlwire._core.columns import Columns
from rlwire._core.faces import alias_old_modules, claim
from rlwire._core.ragged import Ragged
from rlwire._frame.compression import Compressor
from rlwire._frame.frame import Frame
from rlwire.aio import LagMonitor
from rlwire.errors import *  # noqa: F403 (the errors, which rlwire.errors owns)

__version__ = "0.1.0"

__all__ = [
    "Checks",
    "Chunked",
    "ClosedError",
    "Columns",
    "Compressor",
    "ConfigError",
    "CorruptFrameError",
    "DecodeError",
    "EncodeError",
    "EndOfStream",
    "FieldNotFoundError",
    "Frame",
    "FrameTooLargeError",
    "Integrity",
    "LagMonitor",
    "Limits",
    "Manifest",
    "ManifestColumn",
    "MarkSkippedWarning",
    "Part",
    "PluginError",
    "Ragged",
    "ReceiveStats",
    "ReceiveTimeout",
    "Retention",
    "RlwireError",
    "SchemaError",
    "SendStats",
    "SidecarWarning",
    "StaleManifestError",
    "StepExistsError",
    "StepGapError",
    "StepOrderError",
    "StepWriter",
    "SyncSender",
    "SyncStepWriter",
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

claim(__name__, globals(), __all__)

# Modules that were public in earlier versions and are private now: importable, with a warning.
alias_old_modules(
    {
        "rlwire.checks": "rlwire._checks.checks",
        "rlwire.cli": "rlwire._api.cli",
        "rlwire.codecs.json": "rlwire.codecs._json.codec",
        "rlwire.codecs.msgpack": "rlwire.codecs._msgpack.codec",
        "rlwire.compression": "rlwire._frame.compression",
        "rlwire.frame": "rlwire._frame.frame",
        "rlwire.receiver": "rlwire._api.receiver",
        "rlwire.schema": "rlwire._api.schema",
        "rlwire.sender": "rlwire._api.sender",
        "rlwire.stats": "rlwire._api.stats",
        "rlwire.transport.filesystem": "rlwire.transport._file.sink",
    },
    hints={"rlwire.cli": "run the `rlwire` command (`rlwire --help`); no face exports it"},
)
