"""The fence on ray://: a producer still alive after another opened its destination (a
hung process that wakes up, a launcher that started a second one) adds nothing to the
other's run. Producer A, in an actor, sends steps 0-2; producer B, in another, opens
the destination (``overwrite``, ``resume``, ``truncate``); A then sends a step B has not
reached, appends fields, finishes: each call is a ClosedError naming B's open, and
trainers (actors) get B's steps only. Before the fence, A's step 3 was committed (into
B's run with ``overwrite`` and ``truncate``, which trainers got as B's step 3; with
``resume``, B's own step 3 then failed), and A's finish ended B's stream at step 3.

Also, on a real board: every call of a fenced sink is refused and changes nothing
(stage, parts, the resume of a step, seal, prune, finish, fields), stages that only
append fields (never opened) are not fenced, and a board of an rlwire before epochs
fences nothing and keeps working."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from ray_cluster import spare
from ray_fence_actors import run_of

import rlwire
from rlwire import Frame
from rlwire.abc import PartInfo, Seal, SinkOptions
from rlwire.aio import run_sliced
from rlwire.transport import parse_url
from rlwire.transport.ray import RaySink, create_board
from rlwire.transport.ray import _sink as sink_module
from rlwire.transport.ray._board import Board

TIMEOUT = 60.0

#: What every call of a fenced sender says.
FENCED = "another sender opened the destination"


def _get(ref: Any) -> Any:
    return ray.get(ref, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def producers(ray_cluster: None) -> Iterator[list[Any]]:
    """Two held producers (tests/ray_fence_actors.py), up, for this module's tests:
    started early by tests/ray_cluster.py, while the tests before ran."""
    made = [spare("HeldProducer") for _ in range(2)]
    yield made
    for actor in made:
        ray.kill(actor)


def _fenced(answer: object, mode: str) -> bool:
    """Whether a held producer's call answered the fence's ClosedError, naming ``mode``."""
    return (
        isinstance(answer, str)
        and answer.startswith("ClosedError")
        and FENCED in answer
        and f"on_existing={mode!r}" in answer
    )


def _runs(got: list[tuple[int, list[str]]]) -> list[tuple[int, tuple[int, int]]]:
    """Each received step and the (run, step) its batch was made for."""
    out = []
    for step, fingerprint in got:
        name = next(f for f in fingerprint if f.startswith("env_name:"))
        out.append((step, run_of(name.removeprefix("env_name:").strip("'"))))
    return out


@pytest.mark.parametrize(
    ("mode", "start", "first"), [("overwrite", None, 0), ("resume", None, 3), ("truncate", 1, 1)]
)
def test_a_producer_still_alive_after_another_opened_sends_nothing_into_its_run(
    ray_url: str, producers: list[Any], ray_trainers: list[Any], mode: str, start: Any, first: int
) -> None:
    """A (run 1) sends 0-2; B (run 2) opens with ``mode`` and sends its first step (not
    with resume, whose first step is A's next); A sends step 3, appends fields and
    finishes: each refused, naming B's open. B sends on to step 4 and finishes; a
    trainer reads steps 0-4 and the end: every step from B's first on is B's. Fields
    appended by B and by a stage that never opened the destination commit."""
    a, b = producers
    assert _get(a.open.remote(ray_url, 1)) == 0
    assert _get(a.send.remote(3)) == [0, 1, 2]
    assert _get(b.open.remote(ray_url, 2, mode, start)) == first
    if mode != "resume":
        assert _get(b.send.remote(1)) == [first]
    for late in (lambda: a.send.remote(1), lambda: a.add_fields.remote(0, "x"), a.finish.remote):
        answer = _get(late())  # one after the other: an async actor runs calls at once
        assert _fenced(answer, mode), answer
    assert _get(b.send.remote(5 - first - (mode != "resume"))) == list(
        range(first + (mode != "resume"), 5)
    )
    assert _get(b.finish.remote()) == "ok"
    got = _runs(_get(ray_trainers[0].take.remote(ray_url, 0, 0, None)))  # up to the end
    assert got == [(step, (2 if step >= first else 1, step)) for step in range(5)]
    assert _get(ray_trainers[1].append_at_once.remote(ray_url, 4, ["score"])) == []
    assert _get(b.add_fields.remote(4, "value")) == "ok"
    assert _fenced(_get(a.add_fields.remote(4, "late")), mode)
    for actor in (a, b):
        assert _get(actor.close.remote()) == "ok"


def _sink(url: str) -> RaySink:
    return RaySink.from_url(parse_url(url), SinkOptions())


def _frame(header: bytes) -> Frame:
    return Frame(header, (memoryview(bytearray(64)),))


def _state(board: Any) -> Any:
    """What the board holds: its steps, each step's parts, the end, what is staged."""

    def look(b: Board) -> Any:
        parts = {s: {r: len(p) for r, p in ranks.items()} for s, ranks in b.parts.items()}
        return sorted(b._stored()), parts, b.end, len(b.staged)

    return _get(board.__ray_call__.remote(look))


def test_every_call_of_a_fenced_sink_is_refused_and_changes_nothing(ray_url: str) -> None:
    """The first sink committed steps 0-1 and part 0 of step 2 (part by part) when a
    second resumes the destination. Each call of the first (a whole step, a part, the
    resume of step 2, its seal, fields, a prune, the end, the marks max_ahead waits on)
    is a ClosedError naming the second's open, and the board holds what it held; the
    second then finishes step 2."""
    board = create_board(ray_url.removeprefix("ray://"))
    first, second = _sink(ray_url), _sink(ray_url)
    first.open("error")
    for step in (0, 1):
        run_sliced(first.stage(step, [_frame(b"first")])).commit()
    run_sliced(first.stage_part(2, PartInfo(0, 0, "a", 1.0), _frame(b"a"))).commit()
    before = _state(board)
    assert second.open("resume") == 2
    fenced = rf"{FENCED} \(on_existing='resume'\) after this one did"
    calls = {
        "store step 3 rank 0": lambda: run_sliced(first.stage(3, [_frame(b"late")])),
        "store part 1 of rank 0 of step 2": lambda: run_sliced(
            first.stage_part(2, PartInfo(0, 1, "b", 1.0), _frame(b"b"))
        ),
        "resume step 2 part by part": lambda: first.committed_parts(2),
        "seal step 2": lambda: first.seal(Seal(2, (("a",),), ((1.0,),))),
        "append fields to step 0 rank 0": lambda: run_sliced(
            first.stage_fields(0, 0, _frame(b"fields"), names=frozenset({"x"}))
        ),
        "delete the steps before step 2": lambda: (first.prune(2), first.finish(2)),
        "mark the end of the stream at step 2": lambda: first.finish(2),
        "read the consumption marks": lambda: first.read_consumption(1, 2),  # max_ahead
    }
    for what, refused in calls.items():
        with pytest.raises(rlwire.ClosedError, match=f"cannot {what}: {fenced}"):
            refused()
        assert _state(board) == before, what
    assert second.committed_parts(2) == [PartInfo(0, 0, "a", 1.0)]
    run_sliced(second.stage_part(2, PartInfo(0, 1, "c", 1.0), _frame(b"c"))).commit()
    second.seal(Seal(2, (("a", "c"),), ((1.0, 1.0),)))
    second.finish(3)
    assert _state(board) == ([0, 1, 2], {2: {0: 2}}, 3, 0)
    for sink in (first, second):
        sink.close()


def test_a_commit_staged_before_another_open_is_refused_and_let_go_of(ray_url: str) -> None:
    """A step staged before another sender's ``error`` open (at a later ``start_step``:
    the open drops nothing staged before it) is refused at its commit, and what it
    staged goes; fields staged by a stage that never opened commit beside the second."""
    board = create_board(ray_url.removeprefix("ray://"))
    first, second, stage = _sink(ray_url), _sink(ray_url), _sink(ray_url)
    first.open("error")
    run_sliced(first.stage(0, [_frame(b"first 0")])).commit()
    staged = run_sliced(first.stage(1, [_frame(b"first 1")]))
    appended = run_sliced(stage.stage_fields(0, 0, _frame(b"fields"), names=frozenset({"x"})))
    assert second.open("error", 5) == 5
    with pytest.raises(rlwire.ClosedError, match=rf"cannot commit step 1: {FENCED} \(on_exis"):
        staged.commit()
    assert staged.visible is False
    appended.commit()  # never opened: not fenced
    assert _state(board) == ([0], {}, None, 0)
    for sink in (first, second, stage):
        sink.close()


def test_the_board_fences_every_epoch_but_the_newest() -> None:
    """The board's logic: each open is the next epoch; a call naming an older one is
    refused before it changes anything, one naming none (a stage that only appends, an
    rlwire before epochs) is not, and an epoch that is no int is a ValueError."""

    async def run() -> list[Any]:
        board = Board("ray://logic")
        opened = [await board.open("error", None), await board.open("resume", None)]
        answers = [
            await board.stage(0, "old", 0, None, False, ["main"], 1.0, 1),
            await board.stage(0, "new", 0, None, False, ["main"], 1.0, 2),
            await board.commit("new", 1, None, 2),
            await board.stage_fields(0, "f", 0, None, False, ["f"], 1.0, None),
            await board.commit_fields("f", 0, None, None, ["x"], None),
            await board.prune(1, 1),
            await board.finish(1, 1),
        ]
        answers.append((await board.steps(), board.end, dict(board.staged)))
        with pytest.raises(ValueError, match="an epoch must be an int"):
            await board.finish(1, "2")  # type: ignore[arg-type]
        return [opened, *answers]

    opened, *answers, state = asyncio.run(run())
    assert opened == [("ok", 0, 1, []), ("ok", 0, 2, [])]  # resumed: no steps kept
    assert [a[0] for a in answers] == ["fenced", "ok", "ok", "ok", "ok", "fenced", "fenced"]
    assert "(on_existing='resume')" in answers[0][1]
    assert state == ([0], None, {})


def _old_board(where: str) -> Any:
    """A board as an rlwire before epochs made it (an actor, on the cluster): its open
    answers no epoch, and its methods take none (a call naming one is Python's
    TypeError in the board, a TransportError at the sender). Defined here, in a
    function: Ray's workers get the class itself (cloudpickle's copy), not its name."""

    class OldBoard(Board):
        async def open(self, on_existing: Any, first: int | None) -> tuple[Any, ...]:
            return (await super().open(on_existing, first))[:2]

        async def stage(
            self,
            step: int,
            key: str,
            rank: int,
            producer: Any,
            has_side: bool,
            refs: Any,
            timeout: float,
        ) -> tuple[Any, ...]:
            return await super().stage(step, key, rank, producer, has_side, refs, timeout)

        async def commit(self, key: str, ranks: int, checksums: Any = None) -> tuple[Any, ...]:
            return await super().commit(key, ranks, checksums)

        async def stage_part(
            self,
            step: int,
            key: str,
            rank: int,
            index: int,
            producer: Any,
            has_side: bool,
            refs: Any,
            timeout: float,
        ) -> tuple[Any, ...]:
            return await super().stage_part(
                step, key, rank, index, producer, has_side, refs, timeout
            )

        async def commit_part(
            self, key: str, rank: int, index: int, part_key: Any, cost: float
        ) -> tuple[Any, ...]:
            return await super().commit_part(key, rank, index, part_key, cost)

        async def committed_parts(self, step: int) -> tuple[Any, ...]:
            return await super().committed_parts(step)

        async def seal(self, step: int, keys: Any, costs: Any, token: str = "") -> tuple[Any, ...]:
            return await super().seal(step, keys, costs, token)

        async def finish(self, end: int) -> tuple[Any, ...]:
            return await super().finish(end)

        async def prune(self, below: int) -> None:  # type: ignore[override]
            await super().prune(below)

        async def consumption(self, ranks: int) -> list[int | None]:  # type: ignore[override]
            return await super().consumption(ranks)  # type: ignore[return-value]

        async def stage_fields(
            self,
            step: int,
            key: str,
            rank: int,
            producer: Any,
            has_side: bool,
            refs: Any,
            timeout: float,
        ) -> tuple[Any, ...]:
            return await super().stage_fields(step, key, rank, producer, has_side, refs, timeout)

        async def commit_fields(
            self,
            key: str,
            rank: int,
            index: int | None = None,
            token: str | None = None,
            names: list[str] | None = None,
        ) -> tuple[Any, ...]:
            return await super().commit_fields(key, rank, index, token, names)

    return ray.remote(num_cpus=0)(OldBoard).remote(where)


def test_a_board_of_an_rlwire_before_epochs_fences_nothing(
    ray_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A board whose open answers no epoch and whose methods take none (an rlwire
    before epochs made it): a sink names none, and sends, parts, fields, prunes and
    the end work as before, two senders unfenced, as they were."""
    old = _old_board(ray_url)
    monkeypatch.setattr(sink_module, "create_board", lambda *args, **kwargs: old)
    first, second = _sink(ray_url), _sink(ray_url)
    assert first.open("error") == 0
    assert second.open("resume") == 0
    run_sliced(first.stage(0, [_frame(b"first")])).commit()
    run_sliced(second.stage_part(1, PartInfo(0, 0, "a", 1.0), _frame(b"a"))).commit()
    assert first.committed_parts(1) == [PartInfo(0, 0, "a", 1.0)]
    first.seal(Seal(1, (("a",),), ((1.0,),)))
    run_sliced(first.stage_fields(0, 0, _frame(b"x"), names=frozenset({"x"}))).commit()
    assert len(_get(old.read_fields.remote(0, 0))[1]) == 1
    _get(old.mark.remote(0, 1))  # rank 0 moved past step 0: the prune deletes it
    assert first.read_consumption(1, 2) == [1]
    first.prune(1)
    second.finish(2)
    for sink in (first, second):
        sink.close()  # the prune answered
    assert _state(old) == ([1], {1: {0: 1}}, 2, 0)
    ray.kill(old)
