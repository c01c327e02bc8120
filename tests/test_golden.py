"""Messages written by an earlier rlwire (tests/golden/) keep decoding to the same objects."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path
from typing import Any

import anyio
import msgspec
import numpy as np
import pytest
from golden_cases import (
    AS_COLUMNS,
    CASES,
    FIELDS_CASES,
    GOLDEN,
    PARTS_CASES,
    RANKS_CASE,
    RANKS_STEPS,
    STEP0,
    STEP1,
    ZMQ_GOLDEN,
    appended,
    batch,
    fields_batch,
)
from helpers import assert_batches_equal
from test_format_doc import assert_same, read_as_documented

import rlwire
import rlwire.transport


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("verify", [True, False])
def test_golden_files_decode(name: str, verify: bool) -> None:
    make, _, type_ = CASES[name]
    with rlwire.open_receiver(GOLDEN / name, type=type_, verify=verify) as receiver:
        got = receiver.receive(timeout=5)
    want = make()
    if isinstance(want, rlwire.TrainingBatch):
        assert_batches_equal(got, want)
    assert_same(got, want)


@pytest.mark.parametrize("name", sorted(AS_COLUMNS))
def test_golden_files_decode_as_columns(name: str) -> None:
    """Asked for columns, a list stored as columns comes back as a Columns of views."""
    _, _, type_ = CASES[name]
    with rlwire.open_receiver(GOLDEN / name, type=type_, as_columns=True) as receiver:
        got = receiver.receive(timeout=5)
    assert_same(got, AS_COLUMNS[name]())


def test_every_case_has_its_files() -> None:
    cases = [*CASES, *PARTS_CASES, *FIELDS_CASES, RANKS_CASE]
    assert sorted(p.name for p in GOLDEN.iterdir() if p.is_dir()) == sorted(cases)


def test_golden_folders_hold_no_receiver_marks() -> None:
    """The golden folders hold what their writers wrote (tests/golden_cases.py), not the
    consumption marks of a receiver: a test reads them with ``record_consumed=False``,
    or reads a copy. Before, the marks of a test's receivers of ``msgpack-1.8-ranks``
    were committed with its files, and every run wrote them again."""
    marks = sorted(str(p.relative_to(GOLDEN)) for p in GOLDEN.rglob("consumed.*"))
    assert marks == []


def test_the_golden_files_span_both_minor_versions() -> None:
    """The 1.0 files keep decoding beside the 1.1 ones: each main file says which
    version wrote it (bytes 8-11, docs/format.md), and both are here. Files of the
    format's 1.4 (array columns) keep the 1.1 layout, and say so."""
    versions = {}
    for name in CASES:
        main = (GOLDEN / name / "step-00000000.rank-0000.rlw").read_bytes()
        versions[name] = struct.unpack_from("<HH", main, 8)
    later = ("msgpack-1.1-", "msgpack-1.4-")
    assert {n for n, v in versions.items() if v == (1, 1)} == {
        n for n in CASES if n.startswith(later)
    }
    assert {v for n, v in versions.items() if not n.startswith(later)} == {(1, 0)}


def test_a_flipped_byte_in_a_golden_file_is_caught(tmp_path: Path) -> None:
    shutil.copytree(GOLDEN / "msgpack-sidecar-zstd", tmp_path, dirs_exist_ok=True)
    side = next(tmp_path.glob("*.sidecar.rlw"))
    data = bytearray(side.read_bytes())
    data[70] ^= 1  # inside the first sidecar buffer (the prelude is 64 bytes)
    side.write_bytes(bytes(data))
    with rlwire.open_receiver(tmp_path) as receiver:
        with pytest.raises(rlwire.CorruptFrameError, match=r"segment \d+: buffer \d+") as caught:
            receiver.poll()
    assert (caught.value.step, caught.value.rank) == (0, 0)


def test_the_chunked_case_holds_chunked_containers() -> None:
    """The case is only worth keeping if its header really refers to chunks (ext 4, 5)."""
    from rlwire._frame.compression import decompress
    from rlwire.transport import FileSource

    frame = decompress(FileSource(GOLDEN / "msgpack-chunked").read(0))
    codes: set[int] = set()

    def ext_hook(code: int, data: memoryview) -> None:
        codes.add(code)

    msgspec.msgpack.decode(frame.header, ext_hook=ext_hook)
    assert {4, 5} <= codes and len(frame.header) < 1024


def test_golden_zeromq_messages_decode(tmp_path: Path) -> None:
    """The ZeroMQ messages a version-2.0 sender sent for one batch (several data
    messages and a seal), played to a real receiver by a raw ROUTER socket, still come
    back as that batch, verified; with one byte flipped, as a CorruptFrameError."""
    import zmq

    messages = msgspec.msgpack.decode(ZMQ_GOLDEN.read_bytes())
    assert len(messages) > 2 and messages[-1][0] == b"seal"
    flipped = [list(m) for m in messages]
    flipped[1][-1] = bytes([flipped[1][-1][0] ^ 1]) + flipped[1][-1][1:]
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVTIMEO, 30_000)
    url = f"zmq+ipc://{tmp_path}/golden.sock"
    router.bind(url.removeprefix("zmq+"))
    try:
        with rlwire.open_receiver(url) as receiver:
            peer, kind, _ = router.recv_multipart()
            assert kind == b"ready"
            for message in messages:
                router.send_multipart([peer, *message])
            assert_batches_equal(receiver.receive(timeout=30), batch())
            for message in flipped:
                router.send_multipart([peer, *message])
            with pytest.raises(rlwire.CorruptFrameError, match="does not match its checksum"):
                receiver.receive(timeout=30)
    finally:
        router.close()
        context.term()


def _sketch(value: Any) -> Any:
    """A golden message's header decoded to what it is made of: each extension value as
    ``"e<type>"``, a ragged array as ``("ragged", values, offsets)``, a columns value as
    ``("columns", count, layout, {name: column})``, a list of values as ``"values"``."""
    if isinstance(value, msgspec.msgpack.Ext):
        if value.code == 6:
            values, offsets = msgspec.msgpack.decode(value.data, type=list[msgspec.msgpack.Ext])
            return ("ragged", _sketch(values), _sketch(offsets))
        if value.code == 7:
            count, layout, names, columns = msgspec.msgpack.decode(value.data)
            return ("columns", count, layout, dict(zip(names, map(_sketch, columns), strict=True)))
        return f"e{value.code}"
    if isinstance(value, dict):
        return {key: _sketch(v) for key, v in value.items()}
    if isinstance(value, list):
        return "values"
    return value


def _header_sketch(name: str) -> Any:
    from rlwire._frame.compression import decompress
    from rlwire.transport import FileSource

    frame = decompress(FileSource(GOLDEN / name).read(0))
    return _sketch(msgspec.msgpack.decode(frame.header))


OUT, IN = ("ragged", "e1", "e2"), ("ragged", "e2", "e2")  # values out-of-band / inline
BATCH_COLUMNS = {
    "token_ids": OUT,
    "mask": IN,
    "logprobs": OUT,
    "temperatures": OUT,
    "advantages": OUT,
    "env_name": "values",
    "ref_logprobs": "values",  # None in some samples: a column of values
    "routed_experts": OUT,
    "extras": "values",  # a 0-d reward each: a per-sample scalar
}
PER_FIELD = {
    "ids": IN,
    **dict.fromkeys(["by_dtype", "by_shape", "by_presence", "by_ndim"], "values"),
}


@pytest.mark.parametrize(
    ("name", "sketch"),
    [
        ("msgpack-1.1-batch", {"samples": ("columns", 4, 0, BATCH_COLUMNS)}),
        ("msgpack-1.1-batch-sidecar-zstd", {"samples": ("columns", 4, 0, BATCH_COLUMNS)}),
        (
            "msgpack-1.1-packed",
            {
                "hidden": OUT,
                "small": IN,
                "none": IN,
                "micro_batch": (
                    "columns",
                    2,
                    0,
                    {"input_ids": OUT, "position_ids": IN, "reward": "values", "env": "values"},
                ),
            },
        ),
        ("msgpack-1.1-chunked-turns", {"routed_experts": "e1", "logprobs": "e2", "turns": 6}),
        (
            "msgpack-1.1-structs",
            {
                "renamed": (
                    "columns",
                    5,
                    0,
                    {"tokenIds": OUT, "oldLogprobs": IN, "reward": "values", "envName": "values"},
                ),
                "positional": ("columns", 7, 1, {"ids": IN, "score": "values", "tag": "values"}),
            },
        ),
        (
            "msgpack-1.1-dicts",
            (
                "columns",
                9000,
                0,
                {
                    "ids": ("ragged", "e1", "e1"),
                    "be": ("ragged", "e1", "e1"),
                    "n": "e4",
                    "blob": "e4",
                },
            ),
        ),
        (
            "msgpack-1.1-fallback",
            {
                "per_field": ("columns", 4, 0, PER_FIELD),
                "by_keys": "values",
                "by_type": "values",
                "first_without_array": "values",
            },
        ),
    ],
)
def test_the_1_1_cases_hold_what_they_are_for(name: str, sketch: Any) -> None:
    """Each format 1.1 case is only worth keeping if its header holds the columns, ragged
    arrays and fallbacks it was made for (a change to the writer must not quietly turn
    a case into another)."""
    assert _header_sketch(name) == sketch


def test_the_1_1_sidecar_case_keeps_ragged_offsets_in_the_main_file() -> None:
    """``sidecar=("routed_experts",)`` sends that column's values to the sidecar file;
    its offsets, like every other column, stay in the main file (inline here)."""
    from rlwire.transport import FileSource

    frame = FileSource(GOLDEN / "msgpack-1.1-batch-sidecar-zstd").read(0)
    assert frame.sidecar == {4}  # the fifth buffer: routed experts' values


@pytest.mark.parametrize("name", sorted(PARTS_CASES))
def test_golden_parts_decode(name: str, tmp_path: Path) -> None:
    """A step filled part by part (format 1.2; 1.6 for each part after a rank's part 0,
    which names the part 0 it follows): each rank's parts, in order, then the whole step
    joined; the files say their version and the seal lists every rank's keys."""
    parts, _ = PARTS_CASES[name]
    seal = rlwire.transport.FileSource(GOLDEN / name).read_seal(0)
    assert seal is not None and seal.keys == (("g0", 7), ("g1",))
    later = (1, 2) if name == "msgpack-1.2-parts" else (1, 6)
    for path in (GOLDEN / name).glob("*.part-*.rlw"):
        first = ".part-000000." in path.name
        assert struct.unpack_from("<HH", path.read_bytes(), 8) == ((1, 2) if first else later)
    # Reading parts writes the rank's consumption marks: read a copy, not tests/golden/.
    shutil.copytree(GOLDEN / name, tmp_path, dirs_exist_ok=True)
    for rank in range(2):
        mine = [(key, samples) for key, r, samples in parts if r == rank]
        with rlwire.open_receiver(tmp_path, rank=rank) as receiver:
            got = list(receiver.parts(timeout=5))
        assert [(p.key, p.index) for p in got] == [(key, i) for i, (key, _) in enumerate(mine)]
        for part, (_, samples) in zip(got, mine, strict=True):
            assert_batches_equal(part.value, rlwire.TrainingBatch(samples=samples))
        with rlwire.open_receiver(tmp_path, rank=rank) as receiver:
            whole = receiver.receive(timeout=5)
        assert_batches_equal(whole, rlwire.TrainingBatch(samples=[s for _, ss in mine for s in ss]))


def _rows_of(step: int, rank: int) -> list[int]:
    """Which samples rank ``rank`` holds in step ``step`` of the appended-fields case."""
    if step == 0:
        return STEP0[rank]
    return [i for _, r, rows in STEP1 if r == rank for i in rows]


def _appended_to(step: int, rank: int) -> dict[str, Any]:
    return {
        name: column
        for s, r, fields in appended()
        if (s, r) == (step, rank)
        for name, column in fields.items()
    }


def _with_fields(step: int, rank: int) -> rlwire.TrainingBatch:
    """What ``receive()`` of the case's step gives: the samples sent, each with its row of
    every appended field (a TrainingSample field of that name, else ``extras``, where a
    number is a 0-d array)."""
    want = fields_batch(_rows_of(step, rank))
    for name, column in _appended_to(step, rank).items():
        for i, sample in enumerate(want.samples):
            if name in rlwire.TrainingSample.__struct_fields__:
                setattr(sample, name, column[i])
            elif isinstance(column[i], np.generic):
                sample.extras[name] = np.asarray(column[i])
            else:
                sample.extras[name] = column[i]
    return want


@pytest.mark.parametrize("case", FIELDS_CASES)
@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize(("step", "rank"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_golden_appended_fields_decode(step: int, rank: int, verify: bool, case: str) -> None:
    """Fields appended to a step sent whole and to one filled part by part (formats 1.3
    and 1.5) come back with its samples: ``ref_logprobs`` in its field, the others in
    ``extras`` (a ragged row, a float64, a str), rank 1 of step 1 with none."""
    with rlwire.open_receiver(
        GOLDEN / case, rank=rank, start_step=step, verify=verify, record_consumed=False
    ) as receiver:
        got = receiver.receive(timeout=5)
    assert_same(got, _with_fields(step, rank))


@pytest.mark.parametrize("name", FIELDS_CASES)
def test_golden_appended_fields_as_columns_and_by_field(name: str) -> None:
    """Asked for columns, the appended ones follow the step's (an appended
    ``ref_logprobs`` in its place); asked by field, only those are read, appended or
    not, and a step in parts gives its appended columns alone."""
    case = GOLDEN / name
    added = _appended_to(0, 0)
    with rlwire.open_receiver(case, as_columns=True) as receiver:
        cols = receiver.receive(timeout=5).samples
    assert cols.names == (*rlwire.TrainingSample.__struct_fields__, "values", "score", "judge")
    for name, column in added.items():
        assert_same(cols[name], column)
    with rlwire.open_receiver(case, fields=("score", "token_ids", "ref_logprobs")) as receiver:
        cols = receiver.receive(timeout=5).samples
    assert cols.names == ("token_ids", "ref_logprobs", "score")
    assert [len(row) for row in cols["token_ids"]] == [300, 400]
    assert_same(cols["ref_logprobs"], added["ref_logprobs"])
    assert_same(cols["score"], added["score"])
    with rlwire.open_receiver(
        case, start_step=1, fields=("ref_logprobs",), record_consumed=False
    ) as receiver:
        cols = receiver.receive(timeout=5).samples
    assert cols.names == ("ref_logprobs",)
    assert_same(cols["ref_logprobs"], _appended_to(1, 0)["ref_logprobs"])


def _version(path: Path) -> tuple[int, int]:
    """The major and minor version a stored file says it was written as (docs/format.md:
    bytes 8-11 of a main or sidecar file, 4-7 of a seal)."""
    at = 4 if path.name.endswith(".seal.rlw") else 8
    major, minor = struct.unpack_from("<HH", path.read_bytes(), at)
    return major, minor


def _envelope(path: Path) -> dict[str, Any]:
    """The envelope of a main file, as docs/format.md lays it out (after the 24-byte
    prelude, its length at bytes 12-15)."""
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 12)
    return msgspec.msgpack.decode(data[24 : 24 + length])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("name", "version"), [(FIELDS_CASES[0], (1, 3)), (FIELDS_CASES[1], (1, 5))]
)
def test_golden_appended_fields_are_as_documented(
    tmp_path: Path, name: str, version: tuple[int, int]
) -> None:
    """Each file of appended fields says 1.3 or 1.5 (the step's files 1.1, its parts and
    seal 1.2) and is a message of the page's layout whose header is ``{"fields":
    columns}``: the reader built from docs/format.md alone gets the columns of each
    call. A 1.5 file's envelope names the step's message it was checked against in
    ``of``: the rank's main file's ``id``, or its first part's; empty, with no part."""
    case = GOLDEN / name
    for path in case.glob("*.rlw"):
        kind = re.search(r"\.(fields|part|seal)[-.]", path.name)
        want = {"fields": version, "part": (1, 2), "seal": (1, 2)}[kind[1]] if kind else (1, 1)
        assert _version(path) == want, path.name
        if kind and kind[1] == "fields" and not path.name.endswith(".sidecar.rlw"):
            step, rank = (int(n) for n in re.findall(r"\d+", path.name)[:2])
            stem = f"step-{step:08d}.rank-{rank:04d}"
            of = _envelope(path).get("of")
            if version < (1, 5):
                assert of is None, path.name
            elif (case / f"{stem}.rlw").exists():
                assert of == _envelope(case / f"{stem}.rlw")["id"], path.name
            elif (case / f"{stem}.part-000000.rlw").exists():
                assert of == _envelope(case / f"{stem}.part-000000.rlw")["id"], path.name
            else:
                assert of == b"", path.name
    calls: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for step, rank, fields in appended():
        calls.setdefault((step, rank), []).append(fields)
    for (step, rank), mine in calls.items():
        for index, fields in enumerate(mine):
            name = f"step-{step:08d}.rank-{rank:04d}.fields-{index:03d}.rlw"
            # The documented reader reads a step's main file: this one stands in for it.
            shutil.copy(case / name, tmp_path / f"step-{step:08d}.rank-{rank:04d}.rlw")
            doc = read_as_documented(tmp_path, step, rank, as_columns=True)
            assert set(doc) == {"fields"}
            assert_same(doc["fields"], rlwire.Columns(fields))
    assert sorted(p.name for p in case.glob("*.fields-*")) == sorted(
        f"step-{s:08d}.rank-{r:04d}.fields-{i:03d}.rlw"
        for (s, r), m in calls.items()
        for i in range(len(m))
    )


def test_golden_steps_that_record_their_ranks_decode_and_let_a_resume_scale_up(
    tmp_path: Path,
) -> None:
    """Format 1.8: each message of a step sent whole records how many ranks the step
    went to (docs/format.md). Step 1 went to rank 0 alone: a resumed sender knows it is
    whole, not a step of two ranks cut short, and sends the next step to four ranks."""
    for step, rows_of in enumerate(RANKS_STEPS):
        for rank, rows in enumerate(rows_of):
            main = (GOLDEN / RANKS_CASE / f"step-{step:08d}.rank-{rank:04d}.rlw").read_bytes()
            assert struct.unpack_from("<HH", main, 8) == (1, 8)
            with rlwire.open_receiver(
                GOLDEN / RANKS_CASE, rank=rank, start_step=step, record_consumed=False
            ) as r:
                assert_batches_equal(r.receive(timeout=5), fields_batch(rows))
    shutil.copytree(GOLDEN / RANKS_CASE, tmp_path / "run")
    more = [fields_batch([i]) for i in range(4)]

    async def resume() -> int:
        async with rlwire.open_sender(tmp_path / "run", on_existing="resume") as sender:
            return await sender.send_ranks(more)

    assert anyio.run(resume) == 2
    for rank in range(4):
        with rlwire.open_receiver(tmp_path / "run", rank=rank, start_step=2) as receiver:
            assert_batches_equal(receiver.receive(timeout=5), more[rank])
