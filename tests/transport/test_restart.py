"""Where a sender starts among stored steps: start_step, truncate, and resume's checks
for holes and incomplete steps (the rules every store shares, then a real kill)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import forked
import pytest
from helpers import assert_batches_equal, make_batch

import rlwire
from rlwire.transport._stored.names import names_to_delete, start_step
from rlwire.transport.layout import END_NAME, consumed_name, main_name, sidecar_name

pytestmark = pytest.mark.anyio


def stored(steps: dict[int, list[int]], *, sidecars: bool = False) -> list[str]:
    names = [main_name(s, r) for s, ranks in steps.items() for r in ranks]
    if sidecars:
        names += [sidecar_name(s, r) for s, ranks in steps.items() for r in ranks]
    return names


def test_resume_continues_after_complete_steps() -> None:
    names = stored({0: [0, 1], 1: [0, 1], 2: [0, 1]}, sidecars=True)
    assert start_step("d", names, "resume") == 3
    assert start_step("d", names, "resume", 3) == 3


@pytest.mark.parametrize(
    ("names", "message"),
    [
        # A sender killed during the first commit of a fresh directory: rank 0's main
        # part renamed, rank 1's still under its temporary name.
        (
            [main_name(0, 0), "." + main_name(0, 1) + ".0a1b.tmp"],
            r"step 0 is incomplete \(ranks \[0\] of \[0, 1\]\); .*start_step=0, "
            r"on_existing='truncate'",
        ),
        # The same with sidecars: rank 1's sidecar is in place, its main file is not.
        (
            [main_name(0, 0), sidecar_name(0, 0), sidecar_name(0, 1)],
            r"step 0 is incomplete \(ranks \[0\] of \[0, 1\]\)",
        ),
        (stored({3: [0, 1], 5: [0, 1]}), r"step 4 is missing \(a hole\); .*start_step=4"),
        (stored({0: [0, 1], 1: [0], 2: [0, 1]}), r"step 1 is incomplete"),
        (stored({0: [0, 1], 1: [0, 1], 2: [0]}), r"step 2 is incomplete.*start_step=2"),
    ],
)
def test_resume_refuses_holes_and_incomplete_steps(names: list[str], message: str) -> None:
    with pytest.raises(rlwire.StepExistsError, match=message):
        start_step("d", names, "resume")
    assert start_step("d", names, "truncate", 0) == 0  # the repair it names is accepted


def test_resume_accepts_an_oldest_step_partly_deleted_by_retention() -> None:
    # Retention deletes a step's main files from rank 0 up; a failed commit makes them
    # visible from rank 0 up. An oldest step without rank 0 is a deletion cut short.
    assert start_step("d", stored({4: [1], 5: [0, 1]}), "resume") == 6
    with pytest.raises(rlwire.StepExistsError, match="step 4 is incomplete"):
        start_step("d", stored({4: [0], 5: [0, 1]}), "resume")


def test_resume_at_a_start_step_past_a_hole_is_refused() -> None:
    with pytest.raises(rlwire.StepExistsError, match=r"steps 2\.\.4 would be a hole"):
        start_step("d", stored({0: [0], 1: [0]}), "resume", 5)


def test_error_refuses_only_steps_at_or_after_start_step() -> None:
    names = stored({0: [0], 1: [0], 2: [0]})
    assert start_step("d", names, "error", 3) == 3
    with pytest.raises(rlwire.StepExistsError, match=r"steps 1\.\.2 \(2 steps\) at or after"):
        start_step("d", names, "error", 1)
    with pytest.raises(rlwire.StepExistsError, match=r"steps 0\.\.2.*'overwrite'"):
        start_step("d", names, "error")


def test_names_to_delete_orders_marks_then_main_parts_from_the_last_step() -> None:
    """Cut short anywhere, the deletion leaves no hole, no end mark past the steps kept,
    no consumption mark of a deleted step, and no main file without its sidecar."""
    names = stored({0: [0, 1], 1: [0, 1], 2: [0, 1]}, sidecars=True)
    names += [END_NAME, consumed_name(0)]
    assert names_to_delete(names, "truncate", 1) == [
        [END_NAME, consumed_name(0)],
        [main_name(2, 0), main_name(2, 1)],
        [main_name(1, 0), main_name(1, 1)],
        [sidecar_name(s, r) for s in (1, 2) for r in (0, 1)],
    ]
    assert [main_name(0, 0), main_name(0, 1)] == names_to_delete(names, "overwrite", 2)[-2]
    assert names_to_delete(names, "resume", 1) == [[END_NAME]]
    assert names_to_delete(stored({0: [0]}), "resume") == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"on_existing": "truncate"}, "on_existing='truncate' needs start_step"),
        ({"start_step": -1}, "start_step must be an int from 0 to 18446744073709551614"),
        ({"start_step": 1.5}, "start_step must be an int"),
        ({"on_existing": "keep"}, "on_existing must be 'error', 'resume', 'truncate'"),
    ],
)
def test_bad_options_are_config_errors(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(rlwire.ConfigError, match=message):
        rlwire.open_sender(tmp_path, **options)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


KILLED_IN_FIRST_COMMIT = textwrap.dedent("""
    import os, signal, sys, anyio, rlwire
    from rlwire.testing import make_batch
    def killing(real):
        def move(src, dst):
            # Die the moment rank 1's main file is about to appear: rank 0's already has.
            if os.fspath(dst).endswith("step-00000000.rank-0001.rlw"):
                os.kill(os.getpid(), signal.SIGKILL)
            return real(src, dst)
        return move
    os.replace, os.link = killing(os.replace), killing(os.link)
    async def main():
        async with rlwire.open_sender(sys.argv[1]) as sender:
            await sender.send_ranks([make_batch(1, seed=0), make_batch(1, seed=1)])
    anyio.run(main)
""")


async def test_a_killed_first_commit_is_not_resumed(tmp_path: Path) -> None:
    done = forked.run([sys.executable, "-c", KILLED_IN_FIRST_COMMIT, str(tmp_path)])
    assert done.returncode == -9
    assert (tmp_path / main_name(0, 0)).exists() and not (tmp_path / main_name(0, 1)).exists()
    with pytest.raises(rlwire.StepExistsError, match=r"step 0 is incomplete") as caught:
        async with rlwire.open_sender(tmp_path, on_existing="resume"):
            pass
    assert "start_step=0, on_existing='truncate'" in str(caught.value)
    per_rank = [make_batch(1, seed=7), make_batch(1, seed=8)]
    async with rlwire.open_sender(tmp_path, start_step=0, on_existing="truncate") as sender:
        assert await sender.send_ranks(per_rank) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fence.rlw",  # the truncating sender's
        main_name(0, 0),
        main_name(0, 1),
    ]
    for rank in range(2):
        with rlwire.open_receiver(tmp_path, rank=rank) as receiver:
            assert_batches_equal(receiver.receive(timeout=5), per_rank[rank])
