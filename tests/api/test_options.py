"""Option groups: Retention, Integrity and Limits, and the flat keywords they replace."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import make_batch

import rlwire
from rlwire import ConfigError, Integrity, Limits, Retention


def test_groups_are_frozen_and_checked_once() -> None:
    retention = Retention(keep_last=2, max_ahead=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        retention.keep_last = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="keep_last must be an int of at least 1, got 0"):
        Retention(keep_last=0)
    with pytest.raises(ConfigError, match="max_ahead must be an int of at least 0, got -1"):
        Retention(max_ahead=-1)
    with pytest.raises(ConfigError, match="max_decompressed_bytes must be an int"):
        Limits(max_decompressed_bytes=1.5)  # type: ignore[arg-type]
    assert Integrity() == Integrity(checksum=True, fsync=False)


@pytest.mark.parametrize(
    ("flat", "message"),
    [
        ({"keep_last": 0}, "keep_last must be an int of at least 1, got 0"),
        ({"max_ahead": "2"}, "max_ahead must be an int of at least 0, got '2'"),
    ],
)
def test_flat_keywords_fail_as_before(
    tmp_path: Path, flat: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        rlwire.open_sender(tmp_path, **flat)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_compression_ratio must be a positive number"):
        rlwire.open_receiver(tmp_path, max_compression_ratio=0)


def test_a_group_and_its_flat_keywords_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"keep_last and retention= given together"):
        rlwire.open_sender(tmp_path, retention=Retention(max_ahead=1), keep_last=2)
    with pytest.raises(ConfigError, match=r"fsync and integrity= given together"):
        rlwire.open_sender(tmp_path, integrity=Integrity(), fsync=True)
    with pytest.raises(ConfigError, match=r"retention must be a rlwire.Retention, got 3"):
        rlwire.open_sender(tmp_path, retention=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"max_decompressed_bytes and limits= given together"):
        rlwire.open_receiver(tmp_path, limits=Limits(), max_decompressed_bytes=5)
    with pytest.raises(
        TypeError, match=r"open_sender\(\) got an unexpected keyword argument 'kep'"
    ):
        rlwire.open_sender(tmp_path, kep=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"open_receiver\(\) got an unexpected keyword argument"):
        rlwire.open_receiver(tmp_path, keep_last=1)  # type: ignore[call-arg]


@pytest.mark.anyio
async def test_groups_and_flat_keywords_do_the_same(tmp_path: Path) -> None:
    for path, options in (
        (tmp_path / "grouped", {"retention": Retention(keep_last=1), "integrity": Integrity()}),
        (tmp_path / "flat", {"keep_last": 1, "checksum": True}),
    ):
        async with rlwire.open_sender(path, **options) as sender:  # type: ignore[arg-type]
            for _ in range(3):
                await sender.send(make_batch(1))
        with rlwire.open_receiver(path, start_step=2, limits=Limits()) as receiver:
            assert receiver.receive(timeout=5).samples
    stored = [sorted(p.name for p in (tmp_path / d).iterdir()) for d in ("grouped", "flat")]
    assert stored[0] == stored[1]
    with rlwire.open_receiver(tmp_path / "flat", start_step=2, max_compression_ratio=2) as receiver:
        assert receiver.receive(timeout=5).samples


def test_integrity_takes_only_true_or_false(tmp_path: Path) -> None:
    # "no" from a config file would have recorded checksums; None skipped fsync quietly.
    with pytest.raises(ConfigError, match="checksum must be True or False, got 'no'"):
        Integrity(checksum="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fsync must be True or False, got None"):
        rlwire.open_sender(tmp_path, fsync=None)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
