"""A seal over what readers accept (64 MiB: docs/format.md) is refused by the sink
before anything is written, the step left open; a reader that finds one says so."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

import rlwire
from rlwire.abc import Seal, SinkOptions, SourceOptions
from rlwire.transport import FileSource, open_sink, open_source
from rlwire.transport.layout import seal_name

LIMIT = 64 << 20  # docs/format.md: "rlwire refuses more than 64 MiB"


@pytest.fixture(params=["file", "s3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A fresh destination of each stored kind, with its storage options."""
    if request.param == "file":
        return str(tmp_path / "run"), {}
    endpoint = request.getfixturevalue("s3_endpoint")
    return request.getfixturevalue("s3_url") + "/run", endpoint


def test_a_seal_over_the_readers_limit_is_refused_and_the_step_stays_open(
    url: tuple[str, dict[str, Any]],
) -> None:
    where, options = url
    sink = open_sink(where, SinkOptions(storage_options=options))
    sink.open("error")
    # 16,500 keys of 1,024 characters of 4 UTF-8 bytes each: within a key's limit, and
    # about 67.4 MB of seal together.
    keys = tuple(f"{i:08d}" + "\U0001f600" * 1016 for i in range(16_500))
    with pytest.raises(
        rlwire.ConfigError,
        match=rf"step 0 cannot be sealed: its seal would be \d+ bytes \(its 16500 parts'.*"
        rf"over the {LIMIT} bytes \(64 MiB\) readers accept.*the step stays open.*"
        r"start_step=0, on_existing='truncate', with fewer parts or shorter keys",
    ):
        sink.seal(Seal(step=0, keys=(keys,), costs=((0.0,) * len(keys),)))
    source = open_source(where, SourceOptions(rank=0, storage_options=options))
    assert source.read_seal(0) is None  # nothing written
    sink.seal(Seal(step=0, keys=((),), costs=((),)))  # still open: a seal that fits
    assert source.read_seal(0) == Seal(step=0, keys=((),), costs=((),))
    sink.close()


def test_a_reader_names_the_limit_a_seal_is_over(tmp_path: Path) -> None:
    size = LIMIT + 1
    head = struct.pack("<4sHHIQ", b"RLWS", 1, 2, size, 0)  # docs/format.md's prelude
    (tmp_path / seal_name(0)).write_bytes(head + bytes(16))  # its prelude says
    with pytest.raises(
        rlwire.CorruptFrameError,
        match=rf"seal says its body is {size} bytes, over the {LIMIT} bytes \(64 MiB\) a reader",
    ):
        FileSource(tmp_path, rank=0).read_seal(0)
    (tmp_path / seal_name(0)).write_bytes(head + bytes(size))  # its size says: not read
    with pytest.raises(
        rlwire.CorruptFrameError,
        match=rf"a seal is at most {LIMIT + len(head)} bytes, this one {size + len(head)}: not",
    ):
        FileSource(tmp_path, rank=0).read_seal(0)
