"""The JSON codec and JSON lines with numpy arrays that hold no values: one of shape
``(N, 0)`` is ``N`` empty lists in JSON, so past 1 MiB of such text it is refused
(EncodeError naming its path, shape and the size of its text) before anything is
written, whatever ``N``; smaller ones, and every other numpy value, are written as
orjson writes them."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import rlwire
from rlwire.codecs import JsonCodec
from rlwire.codecs.jsonl import adump_jsonl, dump_jsonl, load_jsonl

# Text over the limit (1 MiB): 6 MB of empty lists, some 2 million of them.
_OVER = 2 * 10**6


def _refused(error: pytest.ExceptionInfo[rlwire.EncodeError], where: str, rows: int) -> None:
    message = str(error.value)
    assert f"{where}: numpy array of shape ({rows}, 0) holds no values" in message
    assert f"would take {3 * rows + 1:,} bytes" in message
    assert "may take 1 MiB of JSON at most" in message


def test_the_codec_refuses_an_array_of_no_values_whose_json_is_long() -> None:
    rows = _OVER
    tracemalloc.start()
    try:
        with pytest.raises(rlwire.EncodeError) as caught:
            JsonCodec().encode({"batch": [{"a": np.arange(3), "experts": np.zeros((rows, 0))}]})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _refused(caught, "$.batch[0].experts", rows)
    assert peak < 4 << 20


def test_a_sender_refuses_it_and_writes_nothing(tmp_path: Path) -> None:
    with rlwire.open_sync_sender(tmp_path, codec="json") as sender:
        with pytest.raises(rlwire.EncodeError) as caught:
            sender.send({"a": np.zeros((_OVER, 0), np.int8)})
        assert sender.next_step == 0
    _refused(caught, "step 0, rank 0: $.a", _OVER)
    assert [n for n in os.listdir(tmp_path) if n.startswith("step-")] == []


@pytest.mark.parametrize("face", ["codec", "jsonl"])
def test_the_process_survives_2_to_the_40_rows(tmp_path: Path, face: str) -> None:
    """orjson aborted the process on this one (an allocation of terabytes), so it is
    tried in a process of its own."""
    call = {
        "codec": "JsonCodec().encode(value)",
        "jsonl": f"dump_jsonl([value], {str(tmp_path / 'r.jsonl')!r})",
    }[face]
    script = (
        "import numpy as np, rlwire\n"
        "from rlwire.codecs import JsonCodec\n"
        "from rlwire.codecs.jsonl import dump_jsonl\n"
        "value = {'a': np.zeros((2**40, 0), np.int8)}\n"
        "try:\n"
        f"    {call}\n"
        "except rlwire.EncodeError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "$.a: numpy array of shape (1099511627776, 0) holds no values" in proc.stdout
    assert "3,298,534,883,329 bytes (3.0 TiB)" in proc.stdout


def test_dump_jsonl_refuses_it_naming_the_record(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    records = [{"a": np.zeros((2, 0))}, {"a": np.zeros((_OVER, 0), np.int8)}]
    with pytest.raises(rlwire.EncodeError) as caught:
        dump_jsonl(records, path)
    _refused(caught, "record 1: $.a", _OVER)


@pytest.mark.anyio
async def test_adump_jsonl_refuses_it_too(tmp_path: Path) -> None:
    with pytest.raises(rlwire.EncodeError) as caught:
        await adump_jsonl([{"a": np.zeros((_OVER, 0))}], tmp_path / "r.jsonl")
    _refused(caught, "record 0: $.a", _OVER)


@pytest.mark.parametrize(
    "shape", [(0,), (0, 5), (3, 0), (2, 3, 0), (2, 0, 5), (7, 1, 0, 3), (300_000, 0)]
)
def test_arrays_of_no_values_within_the_limit_are_written_as_before(
    tmp_path: Path, shape: tuple[int, ...]
) -> None:
    arr = np.zeros(shape, np.float32)
    native = orjson.dumps({"a": arr}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert bytes(JsonCodec().encode({"a": arr}).header) == native
    dump_jsonl([{"a": arr}], tmp_path / "r.jsonl")
    assert (tmp_path / "r.jsonl").read_bytes() == native + b"\n"
    assert list(load_jsonl(tmp_path / "r.jsonl")) == [orjson.loads(native)]


_BIG_ENDIAN = np.arange(6, dtype=">i4").reshape(2, 3)


@pytest.mark.parametrize(
    "value",
    [
        np.arange(5, dtype=np.int8),
        np.arange(12, dtype=np.uint64).reshape(3, 4)[:, ::2],  # not contiguous
        np.array([[1.5, np.nan], [np.inf, -0.0]]),
        np.array([0.1, 3e38], np.float32),
        np.array([True, False]),
        np.array(["2024-01-02T03:04:05"], "datetime64[s]"),
        np.arange(40_000, dtype=np.int16),  # written a block of rows at a time
        np.float32(0.1),
        np.float64(-2.5),
        np.int64(2**62),
        np.uint8(255),
        np.bool_(True),
        np.float16(1.5),
        np.array(3),
    ],
)
def test_numpy_values_are_written_as_orjson_writes_them(value: Any) -> None:
    if isinstance(value, np.ndarray):  # what orjson writes: C-contiguous, 0-d as a scalar
        written = value[()] if value.ndim == 0 else np.ascontiguousarray(value)
    else:
        written = value
    native = orjson.dumps({"v": [written]}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert bytes(JsonCodec().encode({"v": [value]}).header) == native


def test_arrays_of_non_native_byte_order_are_written_as_native_ones() -> None:
    native = orjson.dumps([_BIG_ENDIAN.astype("=i4")], option=orjson.OPT_SERIALIZE_NUMPY)
    assert bytes(JsonCodec().encode([_BIG_ENDIAN]).header) == native
