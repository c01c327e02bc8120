"""A damaged sidecar is named: a buffer stored in a sidecar that does not match its
checksum raises ``CorruptFrameError`` naming the sidecar file or object (not the main
file, which is whole), read whole, part by part, by fields or by rows; files and S3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from s3_server import s3_client

import rlwire

MAIN = "step-00000000.rank-0000.rlw"
SIDE = "step-00000000.rank-0000.sidecar.rlw"
PART_SIDE = "step-00000000.rank-0000.part-000000.sidecar.rlw"


def _columns() -> rlwire.Columns:
    rng = np.random.default_rng(3)
    lengths = [300, 0, 700, 500]
    return rlwire.Columns(
        {
            "token_ids": rlwire.Ragged.from_arrays([np.arange(n) for n in lengths]),
            "routed_experts": rlwire.Ragged.from_arrays(
                [rng.integers(0, 4, (n, 4), dtype=np.uint8) for n in lengths]
            ),
        }
    )


def _damage(url: str, options: dict[str, Any], name: str) -> str:
    """Flip every byte of the stored file ``name`` after its 64-byte prelude (its size
    and id stay: every buffer in it then fails its checksum); return where it is."""
    if url.startswith("s3://"):
        bucket, prefix = url[len("s3://") :].split("/", 1)
        client, key = s3_client(options), f"{prefix}/{name}"
        data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        data[64:] = bytes(b ^ 0xFF for b in data[64:])
        client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
        return f"{url}/{name}"
    path = Path(url) / name
    data = bytearray(path.read_bytes())
    data[64:] = bytes(b ^ 0xFF for b in data[64:])
    path.write_bytes(bytes(data))
    return str(path)


def _names_the_sidecar(caught: pytest.ExceptionInfo[rlwire.CorruptFrameError], side: str) -> None:
    err = caught.value
    assert err.where == side, str(err)
    assert str(err).startswith(f"{side}, segment "), str(err)
    assert "in the sidecar) does not match its checksum" in str(err)
    assert err.segment is not None and err.segment >= 1


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_whole_step_names_its_damaged_sidecar(
    file_or_s3: tuple[str, dict[str, Any]], compression: str | None
) -> None:
    url, options = file_or_s3
    opts: dict[str, Any] = {"storage_options": options}
    with rlwire.open_sync_sender(
        url, sidecar=("routed_experts",), compression=compression, **opts
    ) as sender:
        sender.send({"samples": _columns()})
    side = _damage(url, options, SIDE)
    with rlwire.open_receiver(url, type=dict, **opts) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            receiver.receive(timeout=5)
    _names_the_sidecar(caught, side)
    assert (caught.value.step, caught.value.rank) == (0, 0)
    # Only some fields read (a partial read): the sidecar's field is named there too.
    with rlwire.open_receiver(url, type=dict, fields=("routed_experts",), **opts) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            receiver.receive(timeout=5)
    _names_the_sidecar(caught, side)
    # Rows of a column in the sidecar, read through a manifest (its offsets checked).
    with rlwire.open_receiver(url, type=dict, **opts) as receiver:
        manifest = receiver.manifest(0)
        assert manifest is not None
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            receiver.read_rows(manifest, "routed_experts", 0, 4)
    _names_the_sidecar(caught, side)


def test_a_part_names_its_damaged_sidecar(file_or_s3: tuple[str, dict[str, Any]]) -> None:
    url, options = file_or_s3
    opts: dict[str, Any] = {"storage_options": options}
    with rlwire.open_sync_sender(url, sidecar=("routed_experts",), **opts) as sender:
        with sender.open_step(ranks=1) as writer:
            writer.put(_columns(), key="g0")
    side = _damage(url, options, PART_SIDE)
    with rlwire.open_receiver(url, type=dict, **opts) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            list(receiver.parts(timeout=5))
    _names_the_sidecar(caught, side)


def test_a_damaged_main_file_is_named_as_before(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    with rlwire.open_sync_sender(url, sidecar=("routed_experts",)) as sender:
        sender.send({"samples": _columns()})
    path = tmp_path / "run" / MAIN
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # in token_ids, the largest main buffer
    path.write_bytes(bytes(data))
    with rlwire.open_receiver(url, type=dict) as receiver:
        with pytest.raises(rlwire.CorruptFrameError) as caught:
            receiver.receive(timeout=5)
    assert caught.value.where == str(path), str(caught.value)
    assert "in the sidecar" not in str(caught.value)


def _replace(url: str, options: dict[str, Any], name: str, change: Any) -> str:
    """Write ``change(data)`` over the stored file ``name``; return where it is."""
    if url.startswith("s3://"):
        bucket, prefix = url[len("s3://") :].split("/", 1)
        client, key = s3_client(options), f"{prefix}/{name}"
        data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        client.put_object(Bucket=bucket, Key=key, Body=change(data))
        return f"{url}/{name}"
    path = Path(url) / name
    path.write_bytes(change(path.read_bytes()))
    return str(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda data: data[:16] + bytes(16) + data[32:], "sidecar belongs to another message"),
        (lambda data: data[:-64], "sidecar truncated"),
        (lambda data: data[:16], "sidecar truncated to 16 bytes"),
    ],
    ids=["another-message", "truncated", "truncated-in-its-prelude"],
)
def test_a_sidecar_of_another_message_or_size_is_named(
    file_or_s3: tuple[str, dict[str, Any]], change: Any, message: str
) -> None:
    """A sidecar whose prelude names another message (a stale one from an earlier run),
    or that is shorter than its main file's envelope says, names the sidecar file or
    object, read whole or by fields: both named the main file, which is whole."""
    url, options = file_or_s3
    opts: dict[str, Any] = {"storage_options": options}
    with rlwire.open_sync_sender(url, sidecar=("routed_experts",), **opts) as sender:
        sender.send({"samples": _columns()})
    side = _replace(url, options, SIDE, change)
    for fields in (None, ("routed_experts",)):
        with rlwire.open_receiver(url, type=dict, fields=fields, **opts) as receiver:
            with pytest.raises(rlwire.CorruptFrameError, match=message) as caught:
                receiver.receive(timeout=5)
        assert caught.value.where == side, str(caught.value)
