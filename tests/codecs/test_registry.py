"""Codecs by name through the `rlwire.codecs` entry point group, built-in and plugin."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

import rlwire
from rlwire import ConfigError
from rlwire.codecs import (
    GROUP,
    MsgpackCodec,
    available_codecs,
    get_codec,
    make_codec,
    register_codec,
)

PLUGIN = '''
"""A plugin codec: UTF-8 text, stored reversed."""

from typing import Any

from rlwire import Frame


class ReversedText:
    name = "reversed"

    def __init__(self, *, check: Any = None) -> None:
        pass

    def encode_sliced(self, obj: str):
        yield
        return Frame(obj.encode()[::-1], codec=self.name)

    def decode(self, frame: Frame, type: Any = Any, *, writable: bool = False) -> str:
        return bytes(frame.header)[::-1].decode()
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Install a plugin distribution on sys.path: a module plus dist-info metadata that
    registers it in the entry point group, as `pip install` would. The registry reads
    the group again for a name it does not know yet, so nothing needs refreshing."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "reversed_codec.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "reversed_codec-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: reversed-codec\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{GROUP}]\nreversed = reversed_codec:ReversedText\nbroken = no_such_module:Codec\n"
    )
    monkeypatch.syspath_prepend(str(site))
    yield "reversed"
    sys.modules.pop("reversed_codec", None)


def test_builtin_codecs_are_registered_as_entry_points() -> None:
    registered = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    assert registered["msgpack"] == "rlwire.codecs:MsgpackCodec"
    assert registered["json"] == "rlwire.codecs:JsonCodec"
    assert get_codec("msgpack") is MsgpackCodec
    assert {"json", "msgpack"} <= set(available_codecs())


def test_unknown_codec_lists_the_installed_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"unknown codec 'cbor'; installed codecs: .*json, msgpack"
    ):
        rlwire.open_sender(tmp_path, codec="cbor")
    assert not list(tmp_path.iterdir())


def test_options_a_codec_does_not_take(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"codec 'json' does not take these options.*sidecar"):
        rlwire.open_sender(tmp_path, codec="json", sidecar=("routed_experts",))


def test_codec_objects(tmp_path: Path) -> None:
    codec = MsgpackCodec(inline_threshold=0)
    assert make_codec(codec, check=None) is codec
    with pytest.raises(ConfigError, match="options inline_threshold configure a codec by name"):
        rlwire.open_sender(tmp_path, codec=codec, inline_threshold=5)
    with pytest.raises(ConfigError, match="codec must be a name or a codec object"):
        rlwire.open_sender(tmp_path, codec=42)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_plugin_codec_end_to_end(plugin: str, tmp_path: Path) -> None:
    assert plugin in available_codecs()
    async with rlwire.open_sender(tmp_path, codec=plugin, compression="zstd") as sender:
        await sender.send("hello, trainer")
    (main,) = tmp_path.glob("*.rlw")
    assert b"reniart ,olleh" in main.read_bytes()
    # The receiver is told nothing: the message names its codec.
    with rlwire.open_receiver(tmp_path, type=str) as receiver:
        assert receiver.receive(timeout=5) == "hello, trainer"


def test_plugin_that_cannot_load(plugin: str) -> None:
    with pytest.raises(
        ConfigError, match=r"codec 'broken' \(no_such_module:Codec\) cannot be loaded"
    ):
        make_codec("broken")


class UpperText:
    """A codec made in the test: UTF-8 text, stored upper-case."""

    name = "test-upper"

    def __init__(self, *, check: Any = None) -> None:
        pass

    def encode_sliced(self, obj: str) -> Iterator[None]:  # a sliced generator
        yield
        return rlwire.Frame(obj.upper().encode(), codec=self.name)  # type: ignore[return-value]

    def decode(self, frame: rlwire.Frame, type: Any = Any, *, writable: bool = False) -> str:
        return bytes(frame.header).decode()


@pytest.mark.anyio
async def test_register_codec_in_process(tmp_path: Path) -> None:
    register_codec("test-upper", UpperText, clobber=True)  # clobber: run once per backend
    register_codec("test-upper", UpperText)  # the same target again: no conflict
    assert "test-upper" in available_codecs() and get_codec("test-upper") is UpperText
    async with rlwire.open_sender(tmp_path, codec="test-upper") as sender:
        await sender.send("hello")
    with rlwire.open_receiver(tmp_path, type=str) as receiver:
        assert receiver.receive(timeout=5) == "HELLO"
    with pytest.raises(ConfigError, match=r"codec 'msgpack' is already registered .*clobber"):
        register_codec("msgpack", UpperText)
    with pytest.raises(ConfigError, match=r"codec 'x': 42 is not callable"):
        register_codec("x", 42)  # type: ignore[arg-type]
    register_codec("test-upper", "rlwire.codecs:MsgpackCodec", clobber=True)
    assert get_codec("test-upper") is MsgpackCodec


@pytest.mark.anyio
async def test_message_from_a_codec_this_receiver_lacks(tmp_path: Path) -> None:
    class Unregistered(UpperText):
        name = "test-unregistered"

    # A codec object is used as given: no process registered its name.
    async with rlwire.open_sender(tmp_path, codec=Unregistered()) as sender:
        await sender.send("x")
    with rlwire.open_receiver(tmp_path, type=str) as receiver:
        with pytest.raises(
            rlwire.DecodeError,
            match=r"step-00000000.rank-0000.rlw: written "
            r"with codec 'test-unregistered', which this reader cannot load: unknown codec",
        ) as caught:
            receiver.poll()
    assert (caught.value.step, caught.value.rank) == (0, 0)
