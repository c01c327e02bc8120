"""What the SQLite sink promises beyond rlwire's contract: whole steps appear at once,
storage options and URLs are checked, and damaged rows are reported, not trusted."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import anyio
import pytest
from rlwire import (
    ConfigError,
    CorruptFrameError,
    StepExistsError,
    TrainingBatch,
    TransportError,
    open_receiver,
    open_sender,
)
from rlwire.abc import SinkOptions, SourceOptions
from rlwire.aio import run_sliced
from rlwire.codecs import make_codec
from rlwire.testing import assert_batches_equal, make_batch
from rlwire.transport import parse_url
from rlwire.transport.layout import main_name

from rlwire_sqlite_sink import SqliteSink, SqliteSource, sqlite_url


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "run.db"


def test_a_step_appears_for_all_ranks_at_commit_and_never_after_discard(db: Path) -> None:
    codec = make_codec("msgpack", sidecar=("routed_experts",))
    sink = SqliteSink(db)
    sources = [SqliteSource(db, rank=rank) for rank in range(2)]
    try:
        assert sink.open("error") == 0
        frames = [run_sliced(codec.encode_sliced(make_batch(2, seed=r))) for r in range(2)]

        staged = run_sliced(sink.stage(0, frames))
        assert [s.read(0) for s in sources] == [None, None]  # written, not yet visible
        staged.discard()
        assert [s.read(0) for s in sources] == [None, None]

        staged = run_sliced(sink.stage(0, frames))
        staged.commit()
        assert staged.visible
        for rank, source in enumerate(sources):
            frame = source.read(0)
            assert frame is not None and frame.sidecar  # routed_experts went to the sidecar
            assert_batches_equal(codec.decode(frame, TrainingBatch), make_batch(2, seed=rank))
    finally:
        sink.close()
        for source in sources:
            source.close()


def test_an_abandoned_step_stays_hidden_and_the_next_sender_removes_it(db: Path) -> None:
    """A step staged and never committed or discarded (a killed sender) leaves hidden
    rows only; receivers can record their marks meanwhile, and the next sender that
    resumes deletes the rows."""
    codec = make_codec("msgpack")
    frames = [run_sliced(codec.encode_sliced(make_batch(1)))]
    first, second = SqliteSink(db), SqliteSink(db, timeout=0.1)
    source = SqliteSource(db, timeout=0.1)
    try:
        first.open("error")
        run_sliced(first.stage(0, frames))  # never committed
        assert source.read(0) is None
        source.mark_consumed(0)  # the write lock is free between statements
        assert second.open("resume") == 0
        assert second.names() == ["consumed.rank-0000.rlw"]
        run_sliced(second.stage(0, frames)).commit()
        assert source.read(0) is not None
    finally:
        first.close()
        second.close()
        source.close()


def test_errors_say_where_and_keep_the_errno(db: Path, tmp_path: Path) -> None:
    """Errors carry the database, table and step as context rather than in the message,
    and a TransportError keeps the errno of the OS error behind it."""
    codec = make_codec("msgpack")
    frames = [run_sliced(codec.encode_sliced(make_batch(1)))]
    sink = SqliteSink(db, table="run_7")
    try:
        sink.open("error")
        run_sliced(sink.stage(0, frames)).commit()
        with pytest.raises(StepExistsError) as exists:
            run_sliced(sink.stage(0, frames))
    finally:
        sink.close()
    assert (exists.value.where, exists.value.step) == (f"{db} table run_7", 0)
    assert str(exists.value) == f"{db} table run_7, step 0: already exists"

    (tmp_path / "a_file").touch()
    blocked = SqliteSink(tmp_path / "a_file" / "run.db")  # its directory cannot be made
    with pytest.raises(TransportError, match="cannot open the database") as failed:
        blocked.open("error")
    assert failed.value.where == str(tmp_path / "a_file" / "run.db")
    assert isinstance(failed.value.__cause__, OSError)
    assert failed.value.errno is not None
    assert failed.value.errno == failed.value.__cause__.errno


def test_tables_keep_runs_apart(db: Path) -> None:
    async def send(table: str, seed: int) -> None:
        async with open_sender(sqlite_url(db), storage_options={"table": table}) as sender:
            await sender.send(make_batch(1, seed=seed))

    anyio.run(send, "run_a", 1)
    anyio.run(send, "run_b", 2)
    for table, seed in (("run_a", 1), ("run_b", 2)):
        with open_receiver(sqlite_url(db), storage_options={"table": table}) as receiver:
            assert_batches_equal(receiver.receive(timeout=5), make_batch(1, seed=seed))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"table": "bad name; DROP TABLE x"}, "plain SQL name"),
        ({"table": "sqlite_master"}, "belong to SQLite"),
        ({"timeout": -1}, "non-negative number"),
        ({"timeout": "5"}, "non-negative number"),
        ({"journal": "wal"}, "unknown storage option.*'journal'; known: table, timeout"),
    ],
)
def test_bad_storage_options(db: Path, options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SqliteSink.from_url(parse_url(sqlite_url(db)), SinkOptions(storage_options=options))
    with pytest.raises(ConfigError, match=message):
        SqliteSink.open_source(parse_url(sqlite_url(db)), SourceOptions(storage_options=options))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://otherhost/run.db", "not host 'otherhost'"),
        ("sqlite:///run.db?timeout=3", "storage_options"),
        ("sqlite:///data/", "names no database file"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_sender(url)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        # One byte near the end of the last buffer flipped: the checksum catches it.
        (
            "CAST(substr(data, 1, length(data) - 200) || x'ff' "
            "|| substr(data, length(data) - 198) AS BLOB)",
            "does not match its checksum",
        ),
        ("substr(data, 1, 1000)", "truncated"),
        ("42", "does not hold a BLOB"),
    ],
    ids=["flipped-byte", "truncated", "not-a-blob"],
)
def test_a_damaged_row_is_a_corrupt_frame_error(db: Path, damage: str, message: str) -> None:
    async def send() -> None:
        async with open_sender(sqlite_url(db)) as sender:
            await sender.send(make_batch(2, n=5000))

    anyio.run(send)
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:  # closed, after a commit
        conn.execute(
            f"UPDATE rlwire_messages SET data = {damage} WHERE name = ?", (main_name(0, 0),)
        )
    with open_receiver(sqlite_url(db)) as receiver, pytest.raises(CorruptFrameError, match=message):
        receiver.receive(timeout=5)
