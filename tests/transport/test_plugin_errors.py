"""What a plugin raises or returns against its contract reaches users typed: a sink's,
source's or staged step's bare error (a ``ValueError`` of its own, a ``KeyError`` of its
backend), or a wrong result (a ``stage`` returning a str, a ``read`` returning bytes),
becomes a :class:`rlwire.PluginError` naming the plugin, the call and the step, the
original chained; an ``OSError`` a ``TransportError``. rlwire's own errors pass through
as they are, and cancellations are never wrapped. The same for a codec of another
package. The plugins here are the file sink under schemes of their own, one call gone
wrong each (``transport.broken_sinks.BrokenSink``), as a plugin package would register.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from helpers import assert_batches_equal, make_batch
from transport.broken_sinks import BrokenSink

import rlwire
from rlwire import Frame
from rlwire.abc import PendingFrame, Staged
from rlwire.aio import Sliced
from rlwire.codecs import make_codec, register_codec
from rlwire.transport import FileSource, register_sink

pytestmark = pytest.mark.anyio


class Planted(Exception):
    """The planted defect's own error: what a plugin's bug raises."""


class Stop(BaseException):
    """Not an Exception, as KeyboardInterrupt or a cancellation: never wrapped."""


class _Failing(Staged):
    """A staged step whose commit raises ``error`` before anything is visible."""

    def __init__(self, inner: Staged, error: BaseException) -> None:
        self.inner, self.error = inner, error

    def commit(self) -> None:
        raise self.error

    def discard(self) -> None:
        self.inner.discard()


class StageGoesWrong(BrokenSink):
    """``stage`` writes every rank, then (as ``planted`` says) discards it and raises,
    or returns a str, or returns a step whose commit raises."""

    planted: ClassVar[Any] = None

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        staged = yield from super().stage(step, frames)
        planted = type(self).planted
        if planted == "str":
            staged.discard()
            return "not a Staged"  # type: ignore[return-value]
        if isinstance(planted, tuple):  # ("commit", error)
            return _Failing(staged, planted[1])
        if planted is not None:
            staged.discard()
            raise planted
        return staged


class ReadGoesWrong(BrokenSink):
    """Its source's ``read`` raises ``planted``, or returns bytes (``"bytes"``)."""

    planted: ClassVar[Any] = None

    class source_class(FileSource):
        def read(self, step: int) -> Frame | None:
            frame = super().read(step)
            planted = ReadGoesWrong.planted
            if frame is None or planted is None:
                return frame
            if planted == "bytes":
                return bytes(frame.header)  # type: ignore[return-value]
            raise planted


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Path]:
    register_sink("test-stage", StageGoesWrong, clobber=True)
    register_sink("test-read", ReadGoesWrong, clobber=True)
    yield tmp_path / "run"
    StageGoesWrong.planted = ReadGoesWrong.planted = None


def stored(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


@pytest.mark.parametrize(
    ("planted", "says"),
    [
        (Planted("bad row"), r"raised Planted: bad row"),
        (KeyError("the backend's"), r"raised KeyError: \"the backend's\""),
        ("str", r"returned str 'not a Staged', not a rlwire.abc.Staged"),
    ],
)
async def test_a_plugin_sinks_bare_error_or_wrong_result_is_a_plugin_error(
    run: Path, planted: Any, says: str
) -> None:
    """It was the bare error, or AttributeError: 'str' object has no attribute
    'acommit'. Nothing is visible after, and the next send takes the step."""
    StageGoesWrong.planted = planted
    batch = make_batch(2)
    async with rlwire.open_sender(f"test-stage://{run}") as sender:
        with pytest.raises(rlwire.PluginError) as info:
            await sender.send_ranks([batch, batch])
        message = str(info.value)
        assert message.startswith("step 0: stage() of the sink plugin ")
        assert f"{__name__}.StageGoesWrong (scheme 'test-stage')" in message
        assert info.match(says)
        if isinstance(planted, Exception):
            assert info.value.__cause__ is planted
        assert info.value.step == 0
        assert not [name for name in stored(run) if name.startswith("step-")]
        StageGoesWrong.planted = None
        assert await sender.send_ranks([batch, batch]) == 0
    with rlwire.open_receiver(run, rank=1) as receiver:
        assert_batches_equal(receiver.receive(timeout=5), batch)


async def test_a_plugin_commits_bare_error_leaves_the_step_unknown(run: Path) -> None:
    """Typed, and still taken to leave the step's visibility unknown, as before: the
    sender goes on only once reopened with resume."""
    StageGoesWrong.planted = ("commit", Planted("lost the connection"))
    async with rlwire.open_sender(f"test-stage://{run}") as sender:
        with pytest.raises(
            rlwire.PluginError,
            match=r"step 0: commit\(\) of the staged step of plugin .*_Failing raised Planted",
        ):
            await sender.send(make_batch(1))
        StageGoesWrong.planted = None
        with pytest.raises(rlwire.TransportError, match="whether step 0 became visible"):
            await sender.send(make_batch(1))


async def test_a_plugins_os_error_is_a_transport_error(run: Path) -> None:
    StageGoesWrong.planted = OSError(errno.ENOSPC, "No space left on device")
    async with rlwire.open_sender(f"test-stage://{run}") as sender:
        with pytest.raises(rlwire.TransportError, match=r"stage\(\) of the sink plugin") as info:
            await sender.send(make_batch(1))
    assert info.value.errno == errno.ENOSPC
    assert isinstance(info.value.__cause__, OSError)


async def test_rlwire_errors_and_cancellations_pass_through(run: Path) -> None:
    planted = rlwire.StepExistsError("step 0: already exists (the plugin says)")
    StageGoesWrong.planted = planted
    async with rlwire.open_sender(f"test-stage://{run}") as sender:
        with pytest.raises(rlwire.StepExistsError) as info:
            await sender.send(make_batch(1))
        assert info.value is planted
        StageGoesWrong.planted = Stop()
        with pytest.raises(Stop):
            await sender.send(make_batch(1))
        StageGoesWrong.planted = None
        with anyio.move_on_after(0) as scope:  # cancelled at once: no PluginError
            await sender.send(make_batch(1))
        assert scope.cancelled_caught


@pytest.mark.parametrize(
    ("planted", "error", "says"),
    [
        (Planted("bad offset"), rlwire.PluginError, r"raised Planted: bad offset"),
        ("bytes", rlwire.PluginError, r"returned bytes b'.*, not a rlwire.Frame or None"),
        (OSError(errno.EIO, "I/O error"), rlwire.TransportError, r"raised OSError"),
        (Stop(), Stop, None),
    ],
)
async def test_a_plugin_sources_bare_error_or_wrong_result_is_typed(
    run: Path, planted: Any, error: type[BaseException], says: str | None
) -> None:
    """It was the bare error, or AttributeError: 'bytes' object has no attribute
    'compression'; each receive says it again, and the step is there once read well."""
    batch = make_batch(1)
    async with rlwire.open_sender(run) as sender:
        await sender.send(batch)
    ReadGoesWrong.planted = planted
    with rlwire.open_receiver(f"test-read://{run}") as receiver:
        for _ in range(2):
            with pytest.raises(error, match=says) as info:
                receiver.receive(timeout=5)
            if error is not Stop:
                assert str(info.value).startswith(
                    "step 0, rank 0: read() of the source plugin "
                    f"{__name__}.ReadGoesWrong.source_class"
                )
            if isinstance(planted, Exception):
                assert info.value.__cause__ is planted
        ReadGoesWrong.planted = None
        assert_batches_equal(receiver.receive(timeout=5), batch)


class RaisingCodec:
    """A codec of a plugin: msgpack's, its encode or decode raising ``planted``."""

    name = "test-raising"
    planted: ClassVar[dict[str, BaseException]] = {}

    def __init__(self, **options: Any) -> None:
        self.inner = make_codec("msgpack", **options)

    def encode_sliced(self, obj: Any) -> Sliced[Frame]:
        if "encode" in self.planted:
            raise self.planted["encode"]
        frame = yield from self.inner.encode_sliced(obj)
        return replace(frame, codec=self.name)

    def decode(self, frame: Frame, type: Any = Any, *, writable: bool = False) -> Any:
        if "decode" in self.planted:
            raise self.planted["decode"]
        return self.inner.decode(frame, type, writable=writable)


@pytest.fixture
def raising_codec() -> Iterator[dict[str, BaseException]]:
    register_codec(RaisingCodec.name, RaisingCodec, clobber=True)
    yield RaisingCodec.planted
    RaisingCodec.planted.clear()


async def test_a_plugin_codecs_bare_error_is_a_plugin_error_naming_it(
    tmp_path: Path, raising_codec: dict[str, BaseException]
) -> None:
    batch = make_batch(1)
    async with rlwire.open_sender(tmp_path, codec="test-raising") as sender:
        raising_codec["encode"] = Planted("cannot encode")
        with pytest.raises(
            rlwire.PluginError,
            match=r"step 0, rank 0: encode_sliced\(\) of the codec plugin 'test-raising' "
            r"\(.*RaisingCodec\) raised Planted: cannot encode",
        ) as info:
            await sender.send(batch)
        assert info.value.__cause__ is raising_codec.pop("encode")
        assert await sender.send(batch) == 0
    raising_codec["decode"] = planted = Planted("cannot decode")
    with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(
            rlwire.PluginError,
            match=r"step 0, rank 0: decode\(\) of the codec plugin 'test-raising' .*cannot decode",
        ) as info:
            receiver.receive(timeout=5)
        assert info.value.__cause__ is planted
        raising_codec.clear()
        assert_batches_equal(receiver.receive(timeout=5), batch)


def test_a_codec_factory_that_makes_no_codec_is_refused_by_name(tmp_path: Path) -> None:
    """It was AttributeError: 'Thing' object has no attribute 'encode_sliced', at the
    first send."""
    register_codec("test-thing", lambda **options: object(), clobber=True)
    with pytest.raises(rlwire.ConfigError, match=r"codec 'test-thing': its factory returned"):
        rlwire.open_sender(tmp_path, codec="test-thing")
