"""A whole step's envelope key ``ranks`` (format 1.8) forged, its checksum made right:
what receivers, a sender resumed over the directory and ``rlwire inspect`` make of it.

Step 1 of a directory of two steps sent to ranks 0 and 1 gets a hostile ``ranks`` in
one rank's main file: a value of the wrong type, or one no writer writes (not more than
the file's own rank), is a malformed envelope (``CorruptFrameError`` naming the file
and the key), which a resumed sender reads as it reads a step of a writer that recorded
no ranks; a number that disagrees with the ranks listed (huge ones too) makes the
resumed sender refuse the step. The resumed sender runs in a child process under a
memory limit, so that a huge number made into a set of ranks fails the test, not the
machine."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import msgspec
import pytest
import xxhash

import rlwire
from rlwire.testing import assert_batches_equal, make_sample
from rlwire.transport.layout import main_name

pytestmark = pytest.mark.anyio

PRELUDE = struct.Struct("<8sHHIQ")
enc = msgspec.msgpack.encode


class Case(NamedTuple):
    raw: bytes  #: the msgpack bytes of the forged value
    rank: int = 0  #: the rank whose main file of step 1 carries it
    corrupt: bool = False  #: its receiver gets CorruptFrameError
    whole: str = "sent"  #: the resumed sender's lot when every rank's file is listed
    torn: str = "refused"  #: and when rank 1's file of step 1 is gone
    says: str = ""  #: what the refusal of the whole step says


CASES = {
    "2 (as written)": Case(enc(2), torn="refused"),
    "nil": Case(enc(None)),
    "1, fewer than listed": Case(
        enc(1), whole="refused", torn="sent", says="step 1 has ranks [0, 1], but was sent to 1"
    ),
    "3, more than listed": Case(
        enc(3), whole="refused", says="step 1 is incomplete (ranks [0, 1] of the 3 it was sent"
    ),
    "2**63": Case(enc(2**63), whole="refused", says=f"ranks [0, 1] of the {2**63} it was sent"),
    "2**64-1, no int64": Case(enc(2**64 - 1), whole="refused"),
    "-1": Case(enc(-1), corrupt=True),
    "0": Case(enc(0), corrupt=True),
    "1 in rank 1's file": Case(enc(1), rank=1, corrupt=True, torn="skip"),
    "float": Case(enc(2.0), corrupt=True),
    "1e30": Case(enc(1e30), corrupt=True),
    "str": Case(enc("2"), corrupt=True),
    "list": Case(enc([2]), corrupt=True),
    "bool": Case(enc(True), corrupt=True),
    "ext": Case(enc(msgspec.msgpack.Ext(1, b"\x02")), corrupt=True),
}


def batch(step: int, rank: int) -> rlwire.TrainingBatch:
    return rlwire.TrainingBatch(samples=[make_sample(4, seed=10 * step + rank)])


def forge(path: Path, raw: bytes) -> None:
    """Set the envelope's ``ranks`` to the msgpack ``raw``, within the zero padding
    before the header, and make the prelude's length and checksum right again."""
    data = bytearray(path.read_bytes())
    env_len = PRELUDE.unpack_from(data)[3]
    env = msgspec.msgpack.decode(bytes(data[PRELUDE.size : PRELUDE.size + env_len]))
    header_offset = env["header"][0]
    env.pop("ranks", None)
    assert len(env) < 15, "one fixmap"
    new = bytes([0x80 | (len(env) + 1)]) + enc(env)[1:] + enc("ranks") + raw
    assert PRELUDE.size + len(new) <= header_offset, "the forged envelope must fit"
    data[PRELUDE.size : header_offset] = new.ljust(header_offset - PRELUDE.size, b"\0")
    struct.pack_into("<IQ", data, 12, len(new), xxhash.xxh3_64_intdigest(new))
    path.write_bytes(bytes(data))


async def two_steps(root: Path, case: Case, torn: bool) -> None:
    async with rlwire.open_sender(str(root)) as sender:
        for step in range(2):
            await sender.send_ranks([batch(step, rank) for rank in range(2)])
    forge(root / main_name(1, case.rank), case.raw)
    if torn:  # a commit cut short after rank 0's main file
        (root / main_name(1, 1)).unlink()


_RESUME = textwrap.dedent(
    """
    import json, resource, sys
    import anyio, rlwire
    from rlwire.testing import make_sample
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    async def main(root):
        batches = [rlwire.TrainingBatch(samples=[make_sample(4, seed=r)]) for r in range(2)]
        async with rlwire.open_sender(root, on_existing="resume") as sender:
            return await sender.send_ranks(batches)

    outs = []
    for root in sys.argv[2:]:
        try:
            out = ["sent", anyio.run(main, root, backend=sys.argv[1])]
        except rlwire.StepExistsError as exc:
            out = ["refused", str(exc)]
        except BaseException as exc:
            out = ["UNTYPED " + type(exc).__name__, str(exc)[:300]]
        outs.append(out)
    print(json.dumps(outs))
    """
)


def resumed(roots: list[Path], backend: str) -> list[tuple[str, Any]]:
    """What a sender resumed over each of ``roots`` made of sending the next step to two
    ranks: ``("sent", step)``, ``("refused", message)`` or the untyped error. One child
    process, under a memory limit, resumes over every root in turn (a new Python and
    rlwire per root cost most of this module's time)."""
    proc = subprocess.run(
        [sys.executable, "-c", _RESUME, backend, *map(str, roots)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [(out, detail) for out, detail in json.loads(proc.stdout)]


#: Each backend's outcomes of every case, ``[whole]`` or ``[whole, torn]``, by name:
#: the directories of every case are made, and resumed over in one child, by the first
#: test of the backend in this process (a child a test cost most of this module's time).
_RESUMED: dict[str, dict[str, list[tuple[str, Any]]]] = {}


async def resumed_cases(
    factory: pytest.TempPathFactory, backend: str
) -> dict[str, list[tuple[str, Any]]]:
    """:func:`resumed` under ``backend`` over every case's directory, whole and (unless
    skipped) torn, made once in this process: each case's outcomes by its name."""
    if backend not in _RESUMED:
        folder = factory.mktemp(f"resumed-{backend}")
        roots: dict[str, list[Path]] = {}
        for i, (name, case) in enumerate(CASES.items()):
            roots[name] = [folder / f"{i}-run"]
            await two_steps(roots[name][0], case, torn=False)
            if case.torn != "skip":
                roots[name].append(folder / f"{i}-torn")
                await two_steps(roots[name][1], case, torn=True)
        outcomes = iter(resumed([root for both in roots.values() for root in both], backend))
        _RESUMED[backend] = {name: [next(outcomes) for _ in both] for name, both in roots.items()}
    return _RESUMED[backend]


@pytest.mark.parametrize("name", list(CASES))
async def test_a_forged_ranks_key(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, anyio_backend: str, name: str
) -> None:
    """Receivers and a resumed sender on the whole step; then, on a copy whose step 1 is
    listed for rank 0 only, whatever its ``ranks`` says, the resumed sender does not send
    the next step to ranks 0 and 1 after it, unless it says 1 (a step of one rank, then
    a run of more ranks after a restart)."""
    case = CASES[name]
    root = tmp_path / "run"
    await two_steps(root, case, torn=False)
    forged = root / main_name(1, case.rank)
    for rank in range(2):
        with rlwire.open_receiver(str(root), rank=rank, start_step=1) as receiver:
            if case.corrupt and rank == case.rank:
                with pytest.raises(rlwire.CorruptFrameError) as info:
                    receiver.receive(timeout=10)
                assert str(forged) in str(info.value)
                assert "ranks" in str(info.value).replace(str(forged), "")
            else:
                assert_batches_equal(receiver.receive(timeout=10), batch(1, rank))

    outcomes = (await resumed_cases(tmp_path_factory, anyio_backend))[name]

    out, detail = outcomes[0]
    assert out == case.whole, detail
    if out == "sent":
        assert detail == 2
    else:
        assert "step 1" in detail and "start_step=1, on_existing='truncate'" in detail
        assert case.says in detail
    if case.torn != "skip":
        out, detail = outcomes[1]
        assert out == case.torn, detail
        if out == "refused":
            assert "step 1" in detail and "start_step=1, on_existing='truncate'" in detail


_INSPECT = textwrap.dedent(
    """
    import contextlib, io, json, resource, sys, traceback
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    from rlwire._api.cli import main

    outs = []
    for argv in json.loads(sys.argv[1]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except BaseException:
                traceback.print_exc()
                status = -1
        outs.append([status, out.getvalue(), err.getvalue()])
    print(json.dumps(outs))
    """
)


class Inspected(NamedTuple):
    forged: Path  #: the file whose ``ranks`` is forged
    returncode: int  #: -1: an exception came out of the command
    stdout: str
    stderr: str


#: ``rlwire inspect`` on every case's directory, by name: made, and inspected in one
#: child, by the first test of this process that asks.
_INSPECTED: dict[str, Inspected] = {}


def inspected_cases(factory: pytest.TempPathFactory) -> dict[str, Inspected]:
    """``rlwire inspect DIR --step 1 --rank R`` on every case's directory, each run by
    the command's entry point in one child process under a memory limit (a new Python
    and rlwire per case cost most of this test's time); an exception out of it is
    reported as its traceback on stderr, with status -1."""
    if not _INSPECTED:
        folder = factory.mktemp("inspected")
        commands, forged = [], []
        for i, case in enumerate(CASES.values()):
            root = folder / f"{i}-run"
            anyio.run(two_steps, root, case, False)
            forged.append(root / main_name(1, case.rank))
            commands.append(["inspect", str(root), "--step", "1", "--rank", str(case.rank)])
        proc = subprocess.run(
            [sys.executable, "-c", _INSPECT, json.dumps(commands)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        outs = json.loads(proc.stdout)
        for name, path, out in zip(CASES, forged, outs, strict=True):
            _INSPECTED[name] = Inspected(path, *out)
    return _INSPECTED


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.xdist_group("forged-inspect")  # one worker makes and inspects every case, once
def test_inspect_names_a_forged_ranks_key(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    """``rlwire inspect`` on the forged file: a malformed ``ranks`` exits 2 naming the
    key, without a traceback (synchronous, so once, not once per event loop)."""
    case = CASES[name]
    forged, returncode, _, stderr = inspected_cases(tmp_path_factory)[name]
    assert "Traceback" not in stderr
    assert returncode == (2 if case.corrupt else 0), stderr
    if case.corrupt:
        assert "ranks" in stderr.replace(str(forged), "")
