"""``sidecar=`` and a Struct field renamed (``msgspec.field(name=...)``, ``rename=``): the
field answers to its attribute name and to its encoded name alike, whether the Struct is
sent alone, in a dict, or in a list (which the codec stores as columns); a name that is
neither is refused in every shape. Real files, asyncio and trio."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest

import rlwire

pytestmark = pytest.mark.anyio

# The experts' bytes, recognisable in a file.
_MARK = b"EXPERTS!"


class Renamed(msgspec.Struct):
    token_ids: np.ndarray
    routed_experts: np.ndarray = msgspec.field(name="experts")


class Camel(msgspec.Struct, rename="camel"):
    token_ids: np.ndarray
    routed_experts: np.ndarray


_NAMES = {Renamed: "experts", Camel: "routedExperts"}


def _sample(kind: type[Renamed | Camel], n: int) -> Any:
    experts = np.frombuffer(_MARK * n, np.uint8).reshape(n, 4, 2)
    return kind(np.arange(n) + 1000, experts)


def _shaped(kind: type[Renamed | Camel], shape: str) -> Any:
    if shape == "one":
        return _sample(kind, 8)
    if shape == "list":
        return [_sample(kind, 8), _sample(kind, 9)]
    return {"a": _sample(kind, 8), "b": _sample(kind, 9)}


def _files(path: Path) -> dict[str, bytes]:
    return {n: (path / n).read_bytes() for n in os.listdir(path) if n.startswith("step-")}


@pytest.mark.parametrize("shape", ["one", "list", "dict"])
@pytest.mark.parametrize("kind", [Renamed, Camel], ids=["field-name", "rename-camel"])
@pytest.mark.parametrize("spelt", ["attribute", "encoded"])
async def test_a_renamed_field_goes_to_the_sidecar_by_either_name_in_every_shape(
    tmp_path: Path, shape: str, kind: type[Renamed | Camel], spelt: str
) -> None:
    name = "routed_experts" if spelt == "attribute" else _NAMES[kind]
    sent = _shaped(kind, shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no SidecarWarning either
        async with rlwire.open_sender(tmp_path, sidecar=(name,)) as sender:
            await sender.send(sent)
    files = _files(tmp_path)
    assert sorted(files) == [
        "step-00000000.rank-0000.rlw",
        "step-00000000.rank-0000.sidecar.rlw",
    ]
    assert _MARK * 8 in files["step-00000000.rank-0000.sidecar.rlw"]
    assert _MARK not in files["step-00000000.rank-0000.rlw"]
    wanted: Any = {"one": kind, "list": list[kind], "dict": dict[str, kind]}[shape]  # type: ignore[valid-type]
    async with rlwire.open_receiver(tmp_path, type=wanted) as receiver:
        with anyio.fail_after(20):
            got = await receiver.areceive()
    pairs = {"one": lambda x: [x], "list": list, "dict": lambda x: list(x.values())}[shape]
    for back, want in zip(pairs(got), pairs(sent), strict=True):
        assert np.array_equal(back.routed_experts, want.routed_experts)
        assert np.array_equal(back.token_ids, want.token_ids)


@pytest.mark.parametrize("shape", ["one", "list", "dict"])
@pytest.mark.parametrize("kind", [Renamed, Camel], ids=["field-name", "rename-camel"])
async def test_a_name_neither_spelling_matches_is_refused_or_warned_about_in_every_shape(
    tmp_path: Path, shape: str, kind: type[Renamed | Camel]
) -> None:
    """Refused where only the Structs' fields could hold it; in a dict (whose keys vary
    by step) warned about, here made an error."""
    refused: Any = rlwire.SidecarWarning if shape == "dict" else rlwire.ConfigError
    with warnings.catch_warnings():
        warnings.simplefilter("error", rlwire.SidecarWarning)
        async with rlwire.open_sender(tmp_path, sidecar=("routed_expert",)) as sender:
            with pytest.raises(refused, match=r"'routed_expert' match(es|ed) no field"):
                await sender.send(_shaped(kind, shape))
    assert _files(tmp_path) == {}
