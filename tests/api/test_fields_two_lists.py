"""Partial reads by field of a step whose object holds two lists stored as columns
(``{"samples": [...], "eval": [...]}``): each list keeps the named columns it holds,
and a name is missing only when neither holds it. Before, each list was checked for
every name: ``fields=("lp",)`` found ``lp`` missing from ``eval`` and a store receiver
waited its whole timeout, then said the samples held only ``x``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio

STEP = {
    "samples": [
        {"token_ids": np.arange(3), "lp": np.zeros(3)},
        {"token_ids": np.arange(2), "lp": np.ones(2)},
    ],
    "eval": [{"x": np.arange(4)}, {"x": np.arange(1)}, {"x": np.arange(2)}],
    "note": "kept",
}


@pytest.fixture(params=["file", "s3", "zmq"])
def endpoint(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    if request.param == "file":
        return str(tmp_path / "run"), {}
    if request.param == "s3":
        return f"{request.getfixturevalue('s3_url')}/run", request.getfixturevalue("s3_endpoint")
    return f"zmq+ipc://{tmp_path}/run.sock", {}


def _rows(column: rlwire.Ragged) -> list[list[float]]:
    return [row.tolist() for row in column]


@pytest.mark.parametrize(
    ("fields", "kept"),
    [
        (("lp",), {"samples": ("lp",), "eval": ()}),
        (("x",), {"samples": (), "eval": ("x",)}),
        (("x", "token_ids"), {"samples": ("token_ids",), "eval": ("x",)}),
    ],
)
async def test_each_list_keeps_the_named_columns_it_holds_at_once(
    endpoint: tuple[str, dict[str, Any]], fields: tuple[str, ...], kept: dict[str, Any]
) -> None:
    url, options = endpoint
    receiver = rlwire.open_receiver(url, type=Any, fields=fields, storage_options=options)
    async with receiver:
        async with rlwire.open_sender(url, storage_options=options, validate=False) as sender:
            await sender.send(STEP)
            with anyio.fail_after(10):  # the defect waited for ever (a store, no timeout)
                got = await receiver.areceive()
    assert got["note"] == "kept"
    for name, names in kept.items():
        assert isinstance(got[name], rlwire.Columns) and got[name].names == names
        for field in names:
            assert _rows(got[name][field]) == [row[field].tolist() for row in STEP[name]]


async def test_a_name_neither_list_holds_is_missing_naming_what_both_hold(
    endpoint: tuple[str, dict[str, Any]],
) -> None:
    url, options = endpoint
    receiver = rlwire.open_receiver(url, type=Any, fields=("x", "nope"), storage_options=options)
    async with receiver:
        async with rlwire.open_sender(url, storage_options=options, validate=False) as sender:
            await sender.send(STEP)
            if not url.startswith("zmq"):  # a store: the field may still be appended
                with pytest.raises(rlwire.ReceiveTimeout) as waited:
                    await receiver.areceive(timeout=0.5)
                message = str(waited.value)
            else:
                with anyio.fail_after(10), pytest.raises(rlwire.FieldNotFoundError) as caught:
                    await receiver.areceive()
                message = str(caught.value)
    said = re.search(r"field 'nope' not in the step \(its samples hold: ([^)]*)\)", message)
    assert said is not None, message
    assert sorted(said[1].split(", ")) == ["lp", "token_ids", "x"]  # the order read
