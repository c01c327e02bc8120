"""The contract catches broken sinks: :class:`rlwire.testing.SinkContract` run against
sinks with one planted defect each (``broken_sinks.py``: the file sink, real files, one
method gone wrong) fails the tests named for that defect, and passes the same tests on
the sink without a defect. A guard nobody has seen fail guards nothing.

The contract runs as a plugin author runs it: a test module of its own (written here)
whose classes subclass ``SinkContract`` under a plain configuration, in a child
process, once for every defect (the tests chosen with their node ids, under asyncio;
the defects are not the backend's). Its outcomes are read from its JUnit XML report.
The broken classes set the contract's ``timeout`` to a second and a half: a sink that
never delivers fails after that long, the contract's own bound, without hanging the run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from transport.broken_sinks import BROKEN

import rlwire

HERE = Path(__file__).resolve().parent

#: The contract tests each defect must fail, and a pattern its failure report matches
#: (how the contract said it; ``re.search``).
CATCHES: dict[str, tuple[tuple[str, ...], str]] = {
    "dup": (("test_round_trip_in_order",), "token_ids"),
    "order": (("test_round_trip_in_order",), "token_ids"),
    "ranks": (("test_each_rank_gets_its_own_payload",), "token_ids"),
    "inplace": (("test_a_step_being_written_is_never_read_in_part",), "CorruptFrameError"),
    # The refused step stays where the next send goes (StepExistsError), or the
    # receiver took it, whole or half written, before the refusal (a machine under load).
    "halfleft": (
        ("test_a_step_that_fails_its_checks_is_never_delivered",),
        "StepExistsError|CorruptFrameError|numbers of samples|token_ids",
    ),
    "early": (("test_a_step_one_rank_fails_is_delivered_to_no_rank",), "rank 0 got step 0"),
    "corrupt": (("test_round_trip_in_order",), "does not match its checksum"),
    "nosums": (
        ("test_checksums_pass_through_to_the_receiver[asyncio-recorded-verified]",),
        "the step arrived unverified",
    ),
    "keepall": (("test_keep_last_deletes_only_what_every_rank_moved_past",), "AssertionError"),
    "rank0mark": (("test_keep_last_deletes_only_what_every_rank_moved_past",), "AssertionError"),
    "pruneheld": (
        ("test_keep_last_deletes_a_step_held_for_a_rank_left_out_once_it_moved_past",),
        "AssertionError",
    ),
    "nomarks": (
        (
            "test_keep_last_deletes_only_what_every_rank_moved_past",
            "test_max_ahead_waits_for_the_slowest_rank",
        ),
        "",
    ),
    "noend": (("test_finish_ends_the_stream",), "TimeoutError"),
    "gapless": (("test_keep_last_deletes_only_what_every_rank_moved_past",), "did not arrive"),
    "sharedmap": (("test_received_arrays_are_read_only_unless_writable",), "writeable flags"),
    "partorder": (("test_parts_arrive_in_commit_order_or_open_step_is_refused",), ""),
    "lateparts": (
        ("test_a_whole_step_waits_for_its_seal_and_finish_ends_the_stream",),
        "no new part of step 0 came",
    ),
    "shortseal": (
        ("test_a_whole_step_waits_for_its_seal_and_finish_ends_the_stream",),
        "different numbers of samples",
    ),
    "reversed": (
        ("test_pieces_arrive_as_their_joined_bytes[asyncio-as-declared]",),
        "bytes differ from its runs joined",
    ),
    "firstrun": (
        ("test_pieces_arrive_as_their_joined_bytes[asyncio-as-declared]",),
        "bytes differ from its runs joined",
    ),
    "columns": (("test_fields_reads_only_the_named_columns[asyncio-buffers]",), ""),
    # A plugin's bare error, or wrong result, reaches the contract typed and named.
    "bareerror": (
        ("test_round_trip_in_order",),
        r"PluginError: step 0: stage\(\) of the sink plugin .*RaisesBareErrors .*raised ValueError",
    ),
    "readbytes": (
        ("test_round_trip_in_order",),
        r"PluginError: step 0, rank 0: read\(\) of the source plugin .*returned bytes",
    ),
}

#: Seconds the broken classes wait for what should happen (the contract's ``timeout``).
#: Four defects are caught by this wait running out, one after another in the child, so
#: it is most of the child's time; a wait for a small step on local files never comes
#: near it.
BROKEN_TIMEOUT = 1.5

MODULE = """\
import pytest
from broken_sinks import register

from rlwire.testing import SinkContract

register()
"""

CLASS = """
class Test_{name}(SinkContract):
    timeout = {timeout}

    @pytest.fixture
    def sink_url(self, tmp_path):
        return f"broken-{name}://{{tmp_path}}/run"
"""


def node_id(name: str, test: str) -> str:
    """The node id of ``test`` (under asyncio unless its parameters are given)."""
    return f"test_broken_sinks.py::Test_{name}::{test if '[' in test else f'{test}[asyncio]'}"


def run_contract(folder: Path) -> dict[str, tuple[str, str]]:
    """Run the chosen contract tests on every broken sink and on the sound one (class
    ``Test_sound``: each test any defect is caught by) in a child pytest; each node id's
    outcome (``passed``, ``failure``, ``error``, ``skipped``) and report."""
    classes = [CLASS.format(name=name, timeout=BROKEN_TIMEOUT) for name in CATCHES]
    classes.append(CLASS.format(name="sound", timeout=30.0))  # the contract's default
    (folder / "test_broken_sinks.py").write_text(MODULE + "".join(classes))
    (folder / "pytest.ini").write_text("[pytest]\n")
    tests = {test for chosen, _ in CATCHES.values() for test in chosen}
    ids = [node_id(name, test) for name, (chosen, _) in CATCHES.items() for test in chosen]
    ids += [node_id("sound", test) for test in sorted(tests)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    paths = [str(HERE), str(Path(rlwire.__file__).parents[1]), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    report = folder / "report.xml"
    options = ["-c", "pytest.ini", "-p", "no:cacheprovider", "-q", "--junitxml", str(report)]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options, *ids],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    if not report.exists():
        pytest.fail(f"the contract did not run:\n{result.stdout}\n{result.stderr}")
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"test_broken_sinks.py::{case.get('classname', '').rpartition('.')[2]}::"
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
                text = f"{child.get('message', '')}\n{child.text or ''}"
        outcomes[name + str(case.get("name"))] = (outcome, text)
    missing = sorted(set(ids) - set(outcomes))
    assert not missing, f"not run: {missing}\n{result.stdout[-3000:]}"
    return outcomes


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    return run_contract(tmp_path_factory.mktemp("catches"))


def test_every_broken_sink_is_tried() -> None:
    assert set(CATCHES) == set(BROKEN)


@pytest.mark.xdist_group("contract-catches")
@pytest.mark.parametrize("name", sorted(CATCHES))
def test_the_contract_catches_the_defect(outcomes: dict[str, tuple[str, str]], name: str) -> None:
    chosen, says = CATCHES[name]
    for test in chosen:
        outcome, text = outcomes[node_id(name, test)]
        assert outcome == "failure", f"{BROKEN[name].__name__} {outcome} {test}:\n{text}"
        assert re.search(says, text), f"{test} failed, not saying {says!r}:\n{text[-3000:]}"


@pytest.mark.xdist_group("contract-catches")
def test_the_tests_that_catch_them_pass_on_the_sound_sink(
    outcomes: dict[str, tuple[str, str]],
) -> None:
    prefix = node_id("sound", "")[: -len("[asyncio]")]
    sound = {k: v for k, v in outcomes.items() if k.startswith(prefix)}
    failed = {k: textwrap.shorten(v[1], 500) for k, v in sound.items() if v[0] != "passed"}
    assert sound and not failed, failed
