"""Validation of the default schema, field by field."""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import make_batch, make_sample

import rlwire
from rlwire import Frame
from rlwire._api.schema_rows import check_rows_sliced
from rlwire._api.validation import ChecksBeside
from rlwire._frame.pieces import Pieces
from rlwire.aio import run_sliced
from rlwire.codecs import MsgpackCodec
from rlwire.codecs._registry import RowArrays


def check_rows(items: list[Any], path: str) -> None:
    run_sliced(check_rows_sliced(items, path))


def test_valid_sample_and_batch() -> None:
    sample = make_sample(32)
    sample.validate()
    sample.routed_experts = np.zeros((32, 4, 2), np.uint16)  # > 256 experts need uint16
    sample.ref_logprobs = np.zeros(32, np.float64)
    sample.extras = {"values": np.zeros(32, np.float16)}
    rlwire.TrainingBatch(samples=[sample, make_sample(8, routed=False)]).validate()
    assert sample.seq_len == 32


def _set(**changes: Any) -> rlwire.TrainingSample:
    sample = make_sample(10)
    for name, value in changes.items():
        setattr(sample, name, value)
    return sample


@pytest.mark.parametrize(
    ("sample", "match"),
    [
        (_set(token_ids=np.zeros((2, 5), np.int64)), r"token_ids: expected 1 dimension"),
        (_set(token_ids=np.zeros(10, np.bool_)), r"token_ids: token ids must be integers"),
        (_set(mask=np.ones(10, np.int8)), r"mask: must be a bool array"),
        (_set(mask=np.ones(9, bool)), r"mask: has 9 entries but token_ids has 10"),
        (_set(logprobs=np.zeros(10, np.int32)), r"logprobs: must be a float array"),
        (_set(logprobs=np.full(10, np.inf, np.float32)), r"logprobs: 10 non-finite values"),
        (_set(temperatures=np.full(10, np.nan)), r"temperatures: 10 non-finite"),
        (_set(advantages=np.zeros(11, np.float32)), r"advantages: has 11 entries"),
        (_set(ref_logprobs=np.zeros(3)), r"ref_logprobs: has 3 entries"),
        (_set(ref_logprobs=np.array([0.0] * 9 + [np.nan])), r"ref_logprobs: 1 non-finite .* 9"),
        (_set(routed_experts=np.zeros((10, 4), np.uint8)), r"routed_experts: expected 3"),
        (_set(routed_experts=np.zeros((10, 4, 2), np.int32)), r"routed_experts: must be uint8"),
        (_set(routed_experts=np.zeros((11, 4, 2), np.uint8)), r"routed_experts: has 11 rows"),
        (_set(env_name=3), r"env_name: must be str"),
        (_set(extras=[1]), r"extras: must be a dict"),
        (_set(extras={"a": [1, 2]}), r"extras\['a'\]: expected a numpy array, got list"),
        (_set(extras={1: np.zeros(1)}), r"extras: keys must be str"),
        (_set(advantages=None), r"advantages: expected a numpy array, got NoneType"),
        # A Chunked is checked as the array it stands for, its dimensions too.
        (_set(token_ids=rlwire.Chunked([np.zeros((10, 2), np.int64)])), r"token_ids: expected 1"),
        (_set(logprobs=rlwire.Chunked([np.zeros((10, 5), np.float32)])), r"logprobs: expected 1"),
        (_set(routed_experts=rlwire.Chunked([np.zeros((10, 4), np.uint8)])), r"routed_experts: e"),
    ],
)
def test_invalid_sample(sample: rlwire.TrainingSample, match: str) -> None:
    with pytest.raises(rlwire.SchemaError, match=r"^samples\[4\]\." + match):
        sample.validate("samples[4]")


def test_a_non_finite_ref_logprobs_is_named_among_the_fields_that_must_be_finite() -> None:
    """A NaN in ref_logprobs, which is checked finite, was refused saying "logprobs,
    advantages and temperatures must be finite", leaving ref_logprobs out."""
    bad = _set(ref_logprobs=np.array([0.0] * 9 + [np.nan]))
    told = (
        "ref_logprobs: 1 non-finite value (NaN or Inf; first at token 9); "
        "logprobs, advantages, ref_logprobs and temperatures must be finite"
    )
    with pytest.raises(rlwire.SchemaError) as info:
        bad.validate("samples[4]")
    assert str(info.value) == f"samples[4].{told}"
    with pytest.raises(rlwire.SchemaError) as info:
        check_rows([make_sample(10), bad], "$.samples")
    assert str(info.value) == f"$.samples[1].{told}"


def test_batch_errors_name_the_sample_index() -> None:
    bad = make_sample(10)
    bad.logprobs[7] = np.nan
    batch = rlwire.TrainingBatch(samples=[make_sample(10), make_sample(10), bad])
    with pytest.raises(rlwire.SchemaError, match=r"^batch\.samples\[2\]\.logprobs: .* token 7"):
        batch.validate()
    with pytest.raises(rlwire.SchemaError, match=r"samples\[0\]: expected TrainingSample"):
        rlwire.TrainingBatch(samples=[{"token_ids": []}]).validate()  # type: ignore[list-item]
    with pytest.raises(rlwire.SchemaError, match="samples: must be a list"):
        rlwire.TrainingBatch(samples=(make_sample(),)).validate()  # type: ignore[arg-type]


CASES = test_invalid_sample.pytestmark[0].args[1]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("sample", "match"), CASES)
@pytest.mark.parametrize("tokens", [10, 3000])
def test_a_column_check_names_the_same_sample_and_field(
    sample: rlwire.TrainingSample, match: str, tokens: int
) -> None:
    """The codec's check of a whole list (column by column, for lists stored as columns)
    refuses what the check of each sample refuses, with the same message, for small
    rows (joined for one isfinite) and large ones."""
    good = [make_sample(tokens, routed=False) for _ in range(40)]
    bad = copy.copy(sample)
    if "routed_experts" not in match:
        bad.routed_experts = None
    rows = [*good[:17], bad, *good[17:]]
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[17\]\." + match):
        check_rows(rows, "$.samples")
    check_rows(good, "$.samples")  # valid rows pass
    mixed = [*good, make_sample(5, routed=True)]
    mixed[3].logprobs = mixed[3].logprobs.astype(np.float64)  # valid, of another dtype
    check_rows(mixed, "$.samples")
    mixed[-1].routed_experts = np.zeros((5, 2), np.uint8)
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[40\]\.routed_experts"):
        check_rows(mixed, "$.samples")


def test_a_column_check_of_valid_samples_checks_none_of_them_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    monkeypatch.setattr(rlwire.TrainingSample, "validate", lambda s, where="": calls.append(where))
    check_rows([make_sample(n, routed=False) for n in range(1, 300)], "$.samples")
    assert calls == []
    check_rows([make_sample(4, routed=True), make_sample(4, routed=False)], "$.samples")
    assert calls == ["$.samples[0]", "$.samples[1]"]  # routed experts: one by one


def check_beside_codec(items: list[Any]) -> None:
    """The check of ``items`` as a sender runs it: queued by the msgpack codec, which
    hands it the columns it stored (:class:`RowArrays`), run after the encoding."""
    hook = ChecksBeside()
    # On an encoding error the checks still run, and theirs is the error a sender raises.
    with contextlib.suppress(rlwire.EncodeError):
        MsgpackCodec(check=hook).encode({"samples": items})
    queued = hook.take()
    assert queued is not None
    run_sliced(queued)


def _error(check: Callable[[], None]) -> str | None:
    try:
        check()
    except rlwire.SchemaError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(("sample", "match"), CASES)
@pytest.mark.parametrize("tokens", [10, 3000])
def test_a_check_reading_the_codecs_columns_names_the_same_sample_and_token(
    sample: rlwire.TrainingSample, match: str, tokens: int
) -> None:
    """Over the columns the codec joined (small rows) or the rows it kept (large ones),
    the check refuses what the check of each sample refuses, with the same message."""
    good = [make_sample(tokens, routed=False) for _ in range(40)]
    bad = copy.copy(sample)
    if "routed_experts" not in match:
        bad.routed_experts = None
    rows = [*good[:17], bad, *good[17:]]
    alone = _error(lambda: check_rows(rows, "$.samples"))
    assert alone is not None and re.match(r"^\$\.samples\[17\]\." + match, alone)
    assert _error(lambda: check_beside_codec(rows)) == alone
    check_beside_codec(good)


@pytest.mark.parametrize("tokens", [10, 3000])
def test_a_check_reading_a_later_group_of_joined_rows_names_its_sample_and_token(
    tokens: int,
) -> None:
    """The same over many rows, the bad one in a later group of the rows the codec
    joined (once, not for every case above: 1,500 samples each)."""
    late = [make_sample(tokens, routed=False) for _ in range(1500)]
    late[1400].logprobs[tokens // 2] = np.nan
    assert _error(lambda: check_beside_codec(late)) == (
        f"$.samples[1400].logprobs: 1 non-finite value (NaN or Inf; first at token "
        f"{tokens // 2}); logprobs, advantages, ref_logprobs and temperatures must be finite"
    )


@pytest.mark.parametrize("tokens", [10, 3000])
def test_a_column_of_inf_and_minus_inf_or_of_huge_floats_warns_nothing(tokens: int) -> None:
    """The finiteness of a column is told at once (its least and greatest value); +inf
    and -inf in it, or finite values whose sum would overflow, must not raise numpy's
    RuntimeWarning (an error under ``-W error``, as in this suite): the first is refused
    naming the sample, the second passes."""
    huge = [make_sample(tokens, routed=False) for _ in range(40)]
    for s in huge:
        s.advantages = np.full(tokens, 3e38, np.float32)
    check_rows(huge, "$.samples")
    check_beside_codec(huge)
    huge[17].advantages[1:3] = [np.inf, -np.inf]
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[17\]\.advantages: 2 non"):
        check_rows(huge, "$.samples")
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[17\]\.advantages: 2 non"):
        check_beside_codec(huge)
    columns: dict[str, Any] = {
        name: rlwire.Ragged.from_arrays([getattr(s, name) for s in huge]) for name in _TOKEN_FIELDS
    }
    columns["env_name"] = [s.env_name for s in huge]
    packed = rlwire.TrainingBatch(samples=rlwire.Columns(columns))  # type: ignore[arg-type]
    with pytest.raises(rlwire.SchemaError, match=r"samples\[17\]\.advantages: 2 non"):
        packed.validate()


def encoded_keeping_rows(samples: list[Any]) -> tuple[Frame, ChecksBeside, dict[str, Any]]:
    """``samples`` encoded with checks beside: the frame, the hook (its checks queued)
    and the columns the codec handed the check hook."""
    stored: dict[str, Any] = {}

    class Hook(ChecksBeside):
        def rows(self, items: list[Any], path: str) -> dict[str, Any]:
            stored.update(kept=super().rows(items, path))
            return stored["kept"]

    hook = Hook()
    frame = MsgpackCodec(check=hook).encode({"samples": samples})
    return frame, hook, stored["kept"]


def test_the_codec_hands_the_check_its_columns_and_the_check_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Valid samples are checked over what the codec stored (no sample one by one); a
    column that does not hold the samples' values (planted) is not taken on trust."""
    calls: list[str] = []
    monkeypatch.setattr(rlwire.TrainingSample, "validate", lambda s, where="": calls.append(where))
    samples = [make_sample(n % 7 + 1, routed=False) for n in range(300)]
    _, hook, kept = encoded_keeping_rows(samples)
    assert type(kept["logprobs"]) is RowArrays and len(kept["logprobs"].arrays) == 1
    assert kept["env_name"] == [s.env_name for s in samples]
    queued = hook.take()
    assert queued is not None
    run_sliced(queued)
    assert calls == []
    planted = kept["advantages"].arrays[0].copy()
    planted[5] = np.inf
    kept["advantages"] = RowArrays([planted], kept["advantages"].offsets)
    run_sliced(check_rows_sliced(samples, "$.samples", kept))
    assert len(calls) == 300  # the column said "maybe not": each sample checked on its own


def test_the_check_reads_the_groups_the_codec_joined_where_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A column of many small rows is joined in groups (the runs of its buffer); the
    check sums each group where it is (no sample one by one, no copy of the groups) and
    still names the sample and token of a bad value in a later group."""
    calls: list[str] = []
    monkeypatch.setattr(rlwire.TrainingSample, "validate", lambda s, where="": calls.append(where))
    samples = [make_sample(128, seed=i, routed=False) for i in range(3000)]
    frame, hook, kept = encoded_keeping_rows(samples)
    groups = kept["logprobs"].arrays
    assert len(groups) > 2  # 1.5 MB of logprobs
    runs = [run for b in frame.buffers if isinstance(b, Pieces) for run in b.runs]
    assert all(any(np.shares_memory(g, np.asarray(run)) for run in runs) for g in groups)
    with monkeypatch.context() as patched:
        patched.setattr(np, "concatenate", None)  # the groups are read where they are
        queued = hook.take()
        assert queued is not None
        run_sliced(queued)
    assert calls == []
    monkeypatch.undo()
    samples[2900].logprobs[77] = np.nan
    with pytest.raises(rlwire.SchemaError, match=r"^\$\.samples\[2900\]\.logprobs: .*token 77"):
        check_beside_codec(samples)


def test_samples_are_not_tracked_by_the_garbage_collector() -> None:
    """A received step is thousands of samples: tracked, each receive would trigger
    collections (a full one walks every tracked object of the process)."""
    import gc

    batch = make_batch(3)
    assert not gc.is_tracked(batch) and not any(map(gc.is_tracked, batch.samples))


# -- a batch sent packed: TrainingBatch(samples=Columns) -------------------------------

_TOKEN_FIELDS = ("token_ids", "mask", "logprobs", "temperatures", "advantages")


def _packed(samples: list[rlwire.TrainingSample], **changes: Any) -> rlwire.TrainingBatch:
    """``samples`` as a Columns (each per-token field one Ragged), with ``changes``
    replacing or (None) removing columns."""
    columns: dict[str, Any] = {
        name: rlwire.Ragged.from_arrays([getattr(s, name) for s in samples])
        for name in (*_TOKEN_FIELDS, "routed_experts")
    }
    columns["env_name"] = [s.env_name for s in samples]
    for name, value in changes.items():
        if value is None:
            del columns[name]
        else:
            columns[name] = value
    return rlwire.TrainingBatch(samples=rlwire.Columns(columns))  # type: ignore[arg-type]


def _with_row(samples: list[rlwire.TrainingSample], name: str, row: int, value: Any) -> Any:
    arrays = [getattr(s, name) for s in samples]
    arrays[row] = value
    return rlwire.Ragged.from_arrays(arrays)


def _rows() -> list[rlwire.TrainingSample]:
    return [make_sample(10, seed=i) for i in range(40)]


def _bad_logprobs() -> Any:
    rows = _rows()
    rows[17].logprobs[3] = np.nan
    return rlwire.Ragged.from_arrays([s.logprobs for s in rows])


def _listed(row: int, value: Any) -> list[Any]:
    """A list column of 40 rows of 10 float32 zeros, ``value`` at ``row``."""
    rows: list[Any] = [np.zeros(10, np.float32) for _ in range(40)]
    rows[row] = value
    return rows


_REF_AT_17 = [None] * 17 + [np.full(10, np.inf, np.float32)] + [None] * 22
_OFFSETS = np.arange(0, 401, 10)  # 40 rows of 10 tokens


def _flat(shape: tuple[int, ...], dtype: Any) -> rlwire.Ragged:
    return rlwire.Ragged(np.zeros(shape, dtype), _OFFSETS)


def _row17(name: str, value: Any) -> rlwire.Ragged:
    return _with_row(_rows(), name, 17, value)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"logprobs": _bad_logprobs()}, r"\[17\]\.logprobs: 1 non-finite value .*token 3\)"),
        ({"mask": _row17("mask", np.ones(9, bool))}, r"\[17\]\.mask: has 9 entries but token_ids"),
        ({"advantages": _row17("advantages", np.zeros(11, np.float32))}, r"\[17\]\.advantages"),
        ({"mask": _flat((400,), np.int8)}, r"\.mask: must be a bool array"),
        ({"token_ids": _flat((400,), float)}, r"\.token_ids: token ids must be integers"),
        ({"logprobs": np.zeros(40, np.float32)}, r"\.logprobs: .* must be an rlwire.Ragged"),
        # A list column (a field whose rows differ, as received): checked row by row.
        ({"logprobs": _listed(17, np.zeros(10, np.int32))}, r"\[17\]\.logprobs: must be a float"),
        ({"ref_logprobs": _REF_AT_17}, r"\[17\]\.ref_logprobs: 10 non-finite"),
        ({"advantages": None}, r": no column 'advantages'"),
        ({"reward": np.zeros(40)}, r": column 'reward' is not a field of TrainingSample"),
        ({"env_name": ["a"] * 17 + [3] + ["a"] * 22}, r"\[17\]\.env_name: must be str, got int"),
        ({"routed_experts": _flat((400, 4), np.uint8)}, r"\.routed_experts: values must be \["),
        ({"routed_experts": _flat((400, 4, 2), np.int32)}, r"\.routed_experts: must be uint8"),
        ({"routed_experts": _row17("routed_experts", np.zeros((11, 4, 2), "u1"))}, r"\[17\]\.rout"),
        ({"extras": [{}] * 17 + [[1]] + [{}] * 22}, r"\[17\]\.extras: must be a dict"),
        ({"extras": [{}] * 17 + [{"a": [1]}] + [{}] * 22}, r"\[17\]\.extras\['a'\]: expected"),
    ],
)
def test_a_packed_batch_is_checked_by_column_naming_the_sample(
    changes: dict[str, Any], match: str
) -> None:
    batch = _packed(_rows(), **changes)
    with pytest.raises(rlwire.SchemaError, match=r"^batch\.samples" + match):
        batch.validate()


def test_a_valid_packed_batch_passes_with_or_without_optional_columns() -> None:
    rows = _rows()
    _packed(rows).validate()
    _packed(rows, routed_experts=None).validate()
    _packed(rows, routed_experts=[None] * 40, ref_logprobs=[None] * 40).validate()
    ref = rlwire.Ragged.from_arrays([s.logprobs for s in rows])
    _packed(rows, ref_logprobs=ref).validate()
    kinds = zip(_TOKEN_FIELDS, "i?fff", strict=True)
    empty = {name: rlwire.Ragged(np.zeros(0, dtype), [0]) for name, dtype in kinds}
    _packed(rows[:1], **empty, routed_experts=None, env_name=[]).validate()  # no rows
