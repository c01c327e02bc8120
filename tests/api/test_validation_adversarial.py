"""Validation through the sender's faces, against what was made to slip past it
(session 24's adversarial review); each test here failed before its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from depth import examples
from helpers import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlwire
from rlwire import Chunked

# -- TrainingSample's own rules -----------------------------------------------------------------


def with_changed_chunks(extra: Any) -> rlwire.TrainingBatch:
    """Two samples of 5 tokens; sample 1's logprobs a Chunked of 4 tokens whose list of
    chunks then had ``extra`` appended directly (not through ``append``)."""
    batch = make_batch(2, n=5)
    sample = batch.samples[1]
    chunked = Chunked([sample.logprobs[:4]])
    chunked.chunks.append(extra)
    sample.logprobs = chunked  # type: ignore[assignment]  # a Chunked stands for an array
    return batch


CHANGED_CHUNKS = [
    (np.zeros((2, 2), np.float32), r"chunk 1 has dtype float32 and shape \(2, 2\)"),
    (None, r"chunk 1 must be a numpy array of at least one dimension, got NoneType"),
    # Finite, but cast to float32 it is inf: it was reported as a non-finite value.
    (np.array([1e300, 0.0]), r"chunk 1 has dtype float64"),
]


@pytest.mark.parametrize(("extra", "match"), CHANGED_CHUNKS)
def test_a_sample_holding_a_chunked_whose_chunks_were_changed_is_a_schema_error(
    extra: Any, match: str
) -> None:
    """It raised numpy's ValueError, or a TypeError, from ``validate``."""
    with pytest.raises(rlwire.SchemaError, match=r"^batch\.samples\[1\]\.logprobs: " + match):
        with_changed_chunks(extra).validate()


@pytest.mark.anyio
@pytest.mark.parametrize(("extra", "match"), CHANGED_CHUNKS)
async def test_a_sender_refuses_such_a_sample_with_a_schema_error(
    tmp_path: Path, extra: Any, match: str
) -> None:
    async with rlwire.open_sender(tmp_path) as sender:
        with pytest.raises(rlwire.SchemaError, match=r"\$\.samples\[1\]\.logprobs: " + match):
            await sender.send(with_changed_chunks(extra))
        assert list(tmp_path.iterdir()) == []


# -- TrainingBatch(samples=Columns): the first sample's problem, as the list's ------------------

_PER_TOKEN = ("token_ids", "mask", "logprobs", "temperatures", "advantages")


def packed(batch: rlwire.TrainingBatch) -> rlwire.TrainingBatch:
    """``batch``'s samples as a Columns (each per-token field one Ragged), views of theirs."""
    samples = batch.samples
    columns: dict[str, Any] = {
        name: rlwire.Ragged.from_arrays([getattr(s, name) for s in samples])
        for name in (*_PER_TOKEN, "routed_experts")
    }
    if any(s.ref_logprobs is not None for s in samples):
        columns["ref_logprobs"] = rlwire.Ragged.from_arrays([s.ref_logprobs for s in samples])
    columns["env_name"] = [s.env_name for s in samples]
    columns["extras"] = [s.extras for s in samples]
    return rlwire.TrainingBatch(samples=rlwire.Columns(columns))  # type: ignore[arg-type]


def problem(batch: rlwire.TrainingBatch) -> str | None:
    try:
        batch.validate()
    except rlwire.SchemaError as exc:
        return str(exc)
    return None


def test_a_packed_batch_names_the_first_sample_with_a_problem_as_its_list_does() -> None:
    """Column by column, the first column's first bad row was named: sample 30's
    temperatures before sample 12's advantages."""
    batch = make_batch(40, n=8)
    batch.samples[30].temperatures[2] = np.nan
    batch.samples[12].advantages[5] = np.inf
    assert (
        problem(batch)
        == problem(packed(batch))
        == (
            "batch.samples[12].advantages: 1 non-finite value (NaN or Inf; first at token 5); "
            "logprobs, advantages, ref_logprobs and temperatures must be finite"
        )
    )


@settings(max_examples=examples(150), deadline=None)
@given(
    count=st.integers(1, 30),
    refs=st.booleans(),
    flaws=st.lists(
        st.tuples(
            st.integers(0, 29),
            st.sampled_from(["logprobs", "temperatures", "advantages", "ref_logprobs", "env"]),
            st.integers(0, 40),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_property_a_packed_batch_and_its_list_name_the_same_problem(
    count: int, refs: bool, flaws: list[tuple[int, str, int]]
) -> None:
    batch = make_batch(count, n=4)
    for sample in batch.samples:
        if refs:
            sample.ref_logprobs = np.zeros(len(sample.token_ids), np.float32)
    for row, field, token in flaws:
        sample = batch.samples[row % count]
        if field == "env":
            sample.env_name = 7  # type: ignore[assignment]  # what the test is about
        elif field != "ref_logprobs" or refs:
            values = getattr(sample, field)
            values[token % len(values)] = np.nan
    assert problem(packed(batch)) == problem(batch)


# -- what a check= raises past Exception -----------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
async def test_a_sender_raises_what_a_check_raises_past_exception_and_goes_on(
    tmp_path: Path, raised: type[BaseException]
) -> None:
    """Not swallowed (nor made a SchemaError), nothing written, the step not used up."""
    calls: list[Any] = []

    def check(obj: Any) -> None:
        calls.append(obj)
        if len(calls) == 1:
            raise raised

    async with rlwire.open_sender(tmp_path, validate=rlwire.Checks(check=check)) as sender:
        with pytest.raises(raised):
            await sender.send({"x": 1.0})
        assert list(tmp_path.iterdir()) == []
        assert await sender.send({"x": 1.0}) == 0


# -- the sync face --------------------------------------------------------------------------


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_a_sync_sender_raises_what_a_check_raises_past_exception_and_goes_on(
    tmp_path: Path, raised: type[BaseException]
) -> None:
    """A ``check=`` that raises KeyboardInterrupt (or SystemExit) runs on the sender's
    event-loop thread: it ended that loop, the next send raised CancelledError and
    ``close()`` an AttributeError that hid the interrupt, the sink left open."""
    calls: list[Any] = []

    def check(obj: Any) -> None:
        calls.append(obj)
        if len(calls) == 1:
            raise raised

    checks = rlwire.Checks(finite=("x",), check=check)
    with rlwire.open_sync_sender(tmp_path, validate=checks) as sender:
        with pytest.raises(raised):
            sender.send({"x": 1.0})
        assert list(tmp_path.iterdir()) == []
        assert sender.next_step == 0
        assert sender.send({"x": 1.0}) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000000.rank-0000.rlw"]


def test_an_interrupt_from_a_check_is_not_hidden_by_the_close_of_the_with_block(
    tmp_path: Path,
) -> None:
    def check(obj: Any) -> None:
        raise KeyboardInterrupt

    checks = rlwire.Checks(finite=("x",), check=check)
    with pytest.raises(KeyboardInterrupt), rlwire.open_sync_sender(tmp_path, validate=checks) as s:
        s.send({"x": 1.0})


# -- parts ----------------------------------------------------------------------------------

X_FINITE = rlwire.Checks(finite=("x",))


@pytest.mark.anyio
async def test_a_part_that_fails_its_checks_is_named_and_nothing_of_it_is_visible(
    tmp_path: Path,
) -> None:
    """The error named the step and the rank, not which put (a part's index and key)."""
    async with rlwire.open_sender(tmp_path, validate=X_FINITE) as sender:
        async with sender.open_step(ranks=2) as writer:
            await writer.put([{"x": 1.0}], key="a")
            with pytest.raises(rlwire.SchemaError) as info:
                await writer.put([{"x": 1.0}, {"x": float("nan")}], key="b")
            assert str(info.value) == (
                "step 0, rank 1, part 0 (key 'b'): $[1].x: nan is not finite ('x' is checked "
                "finite)"
            )
            assert (info.value.step, info.value.rank) == (0, 1)
            assert [p.name for p in tmp_path.iterdir()] == [
                "step-00000000.rank-0000.part-000000.rlw"
            ]
            batch = make_batch(6)
            batch.samples[4].advantages[2] = np.inf
            named = r"^step 0, rank 1, part 0 \(key 7\): \$\[4\]\.advantages: 1 non-finite"
            with pytest.raises(rlwire.SchemaError, match=named):
                await writer.put(batch.samples, key=7)
            await writer.put([{"x": 2.0}], key="b")  # the key was not used up
        assert writer.assignment == (("a",), ("b",))


def test_a_part_put_through_the_sync_face_is_named_too(tmp_path: Path) -> None:
    with rlwire.open_sync_sender(tmp_path, validate=X_FINITE) as sender, sender.open_step() as w:
        with pytest.raises(rlwire.SchemaError, match=r"^step 0, rank 0, part 0 \(key 'k'\): "):
            w.put([{"x": float("inf")}], key="k")
        assert list(tmp_path.iterdir()) == []


# -- a packed step received into the default type ---------------------------------------------


@pytest.mark.anyio
async def test_a_packed_step_without_a_field_names_the_sample_type_and_the_field(
    tmp_path: Path,
) -> None:
    """Sent as rlwire.Columns without ``advantages`` (a dict, which TrainingSample's rules
    do not look into), received as the default TrainingBatch: the DecodeError said
    "does not match list", not which list."""
    batch = make_batch(3)
    names = ("token_ids", "mask", "logprobs", "temperatures")
    columns: dict[str, Any] = {
        name: rlwire.Ragged.from_arrays([getattr(s, name) for s in batch.samples]) for name in names
    }
    columns["env_name"] = [s.env_name for s in batch.samples]
    async with rlwire.open_sender(tmp_path) as sender:
        await sender.send({"samples": rlwire.Columns(columns)})
    async with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.DecodeError) as info:
            await receiver.areceive(timeout=10)
    assert str(info.value).endswith(
        ": received data does not match list[TrainingSample]: Object missing required field "
        "`advantages` - at `$.samples[0]`"
    )
