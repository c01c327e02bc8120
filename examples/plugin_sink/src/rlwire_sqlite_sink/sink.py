"""An rlwire sink that stores every message as a row of BLOBs in a SQLite database.

``open_sender("sqlite:///path/to/run.db")`` writes here once this package is installed:
its ``pyproject.toml`` registers :class:`SqliteSink` under the ``sqlite`` URL scheme in
the ``rlwire.sinks`` entry point group, and ``open_receiver`` with the same URL reads
through :class:`SqliteSource`.

Each step and rank is one row of a table (``rlwire_messages`` unless the ``table``
storage option names another)::

    step INTEGER | rank INTEGER | main BLOB | sidecar BLOB or NULL

The BLOBs hold exactly the bytes the filesystem sink puts in its files (rlwire's shared
layout, ``docs/format.md``), so a row can be checked with the same reader code and the
message keeps its version, checksums and sidecar split.

How the sink keeps rlwire's promise that nothing is ever half-visible: every row of a
step is inserted inside one SQLite transaction, and ``Staged.commit`` is that
transaction's ``COMMIT``. Readers cannot see uncommitted rows, so the commit is the
"ready" marker, and it covers all ranks at once. A cancelled or failed send is a
``ROLLBACK``; after a crash or ``kill -9`` SQLite rolls the open transaction back the
next time the database is opened. Nothing needs cleaning up by hand.

Errors are rlwire's own, which users already catch: ``ConfigError`` for a bad URL or
option, ``StepExistsError`` for a step already stored, ``CorruptFrameError`` for a
damaged row, and ``TransportError`` for whatever SQLite or the OS refuses, made by
``transport_error`` so that it keeps the errno. Each names where it happened (the
database file, and the table once one is involved) and the step and rank it knows,
as context rather than inside the message: ``str()`` shows
``/data/run.db table rlwire_messages, step 3, rank 1: cannot write: ...``.

SQLite is a single-machine store: its locks do not work on network filesystems, so use
this sink when sender and trainers share one host (``file://`` or ``s3://`` otherwise).
"""

from __future__ import annotations

import contextlib
import math
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from rlwire import (
    ConfigError,
    CorruptFrameError,
    EndOfStream,
    Frame,
    RlwireError,
    StepExistsError,
    TransportError,
)
from rlwire.abc import (
    URL,
    OnExisting,
    PendingFrame,
    Sink,
    SinkOptions,
    Sliced,
    SliceTimer,
    Source,
    SourceOptions,
    Staged,
)
from rlwire.transport import parse_url, reject_unknown, take_frame, transport_error
from rlwire.transport.layout import checksum_segments, parse_main, plan

__all__ = ["DEFAULT_TABLE", "DEFAULT_TIMEOUT", "SqliteSink", "SqliteSource", "sqlite_url"]

#: The table messages go to unless the ``table`` storage option names another.
DEFAULT_TABLE = "rlwire_messages"
#: The rank of the row that marks the end of a finished stream (its step is the end).
END_RANK = -1
#: Seconds to wait for another connection's lock before giving up (``timeout`` option).
DEFAULT_TIMEOUT = 5.0

#: The storage options this sink and its source take; any other key is a ConfigError.
OPTIONS = ("table", "timeout")

#: Bytes handed to one ``Blob.write`` call. SQLite copies them into its page cache; the
#: bound keeps a single call short, and the time check between calls decides when to
#: hand the GIL back to the sender's event loop.
CHUNK_BYTES = 4 << 20

# A bare SQL identifier: table names are put into SQL text (they cannot be bound as
# parameters), so only names that need no quoting or escaping are accepted.
_TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def sqlite_url(path: str | Path) -> str:
    """The ``sqlite://`` URL of a database file, percent-quoted like a ``file://`` URL.

    Example:
        >>> sqlite_url("/data/run 1.db")
        'sqlite:///data/run%201.db'
    """
    return "sqlite" + Path(path).absolute().as_uri().removeprefix("file")


def database_path(url: str | URL) -> Path:
    """The database file a ``sqlite:///path/to/run.db`` URL names.

    The URL follows ``file://`` URLs: three slashes and an absolute path. ``localhost``
    is accepted as the host; any other host is an error, because SQLite is local.

    Raises:
        ConfigError: the URL names another host, carries a query or names no file.
    """
    url = parse_url(url)  # rlwire hands from_url a parsed URL; accept a string too
    parts = url.parts
    if parts.scheme != "sqlite":
        raise ConfigError("not a sqlite:// URL", where=url)
    if parts.netloc not in ("", "localhost"):
        raise ConfigError(
            f"sqlite URLs name a local file (sqlite:///path/to/run.db), not host {parts.netloc!r}",
            where=url,
        )
    if parts.query or parts.fragment:
        raise ConfigError("pass options as storage_options, not in the URL", where=url)
    path = unquote(parts.path)
    if not path or path.endswith("/"):
        raise ConfigError("names no database file (sqlite:///path/to/run.db)", where=url)
    return Path(path)


def _parse_options(where: object, options: Mapping[str, Any]) -> tuple[str, float]:
    """``(table, timeout)`` from the storage options, checked; ``where`` (the URL or
    database path) names the destination in the errors."""
    reject_unknown(where, options, OPTIONS)
    table = options.get("table", DEFAULT_TABLE)
    if not isinstance(table, str) or not _TABLE_RE.fullmatch(table):
        raise ConfigError(
            "storage option 'table' must be a plain SQL name "
            f"(letters, digits, underscores; at most 63), got {table!r}",
            where=where,
        )
    if table.lower().startswith("sqlite_"):
        raise ConfigError("table names starting with 'sqlite_' belong to SQLite", where=where)
    timeout = options.get("timeout", DEFAULT_TIMEOUT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout < 0
    ):
        raise ConfigError(
            f"storage option 'timeout' must be a non-negative number of seconds, got {timeout!r}",
            where=where,
        )
    return table, float(timeout)


@contextlib.contextmanager
def _sqlite_errors(
    action: str, where: object, *, step: int | None = None, rank: int | None = None
) -> Iterator[None]:
    """Turn what SQLite and the OS raise inside the block into rlwire's TransportError,
    which callers of ``send`` and ``receive`` already handle: ``transport_error`` says
    what could not be done and keeps the errno, and the context says where."""
    try:
        yield
    except RlwireError:
        raise  # already one of rlwire's (StepExistsError is an OSError too)
    except (sqlite3.Error, OSError) as exc:
        err = transport_error(exc, action, where=where)
        raise err.add_context(step=step, rank=rank) from exc


def _byte_view(chunk: bytes | memoryview) -> memoryview:
    """A flat byte view of a layout chunk, so it can be cut into chunks by byte offset."""
    view = memoryview(chunk)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class _SqliteStaged(Staged):
    """A step whose rows are inserted in a transaction that is still open."""

    def __init__(self, conn: sqlite3.Connection, where: str, step: int) -> None:
        self._conn = conn
        self._where = where
        self._step = step

    def commit(self) -> None:
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # A COMMIT that fails leaves the transaction uncommitted: no rank can see
            # anything, so `visible` stays False and the sender may retry the step.
            self.discard()
            err = transport_error(exc, "commit (nothing was made visible)", where=self._where)
            raise err.add_context(step=self._step) from exc
        # One COMMIT covers every rank: the whole step appeared at once.
        self.visible = True

    def discard(self) -> None:
        # A ROLLBACK that fails leaves nothing visible either: SQLite drops an
        # uncommitted transaction when its connection closes or its process dies.
        with contextlib.suppress(sqlite3.Error):
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")


class SqliteSink(Sink):
    """Writes each step as rows of one table in a SQLite database, one row per rank.

    Built by rlwire from a ``sqlite:///path/to/run.db`` URL through :meth:`from_url`;
    it can also be made directly and handed to ``rlwire.TrainingBatchSender``.

    Args:
        path: the database file; it and its directory are created when missing.
        table: the table that holds the messages (storage option ``table``), so that
            several runs can share one database file.
        timeout: seconds to wait for a lock held by another connection before failing
            with TransportError (storage option ``timeout``).
        fsync: sync every commit to disk before it returns (``PRAGMA synchronous=FULL``),
            so a step survives a power loss; otherwise a step survives a crash of the
            process but maybe not of the machine.
        checksum: record an xxh3-64 checksum of every segment, which readers verify.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        table: str = DEFAULT_TABLE,
        timeout: float = DEFAULT_TIMEOUT,
        fsync: bool = False,
        checksum: bool = True,
    ) -> None:
        self.path = Path(path)
        self.table, self.timeout = _parse_options(
            str(self.path), {"table": table, "timeout": timeout}
        )
        self.fsync = fsync
        self.checksum = checksum
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"SqliteSink({str(self.path)!r}, table={self.table!r})"

    @property
    def _where(self) -> str:
        """Names this sink's messages in errors: database and table, for several runs
        may share one database file."""
        return f"{self.path} table {self.table}"

    @classmethod
    def from_url(cls, url: URL, options: SinkOptions) -> SqliteSink:
        # Only parse and check here: open_sender calls this synchronously, so the
        # database is first touched by open(), which rlwire runs in a worker thread.
        table, timeout = _parse_options(url, options.storage_options)
        return cls(
            database_path(url),
            table=table,
            timeout=timeout,
            fsync=options.fsync,
            checksum=options.checksum,
        )

    @classmethod
    def open_source(cls, url: URL, options: SourceOptions) -> SqliteSource:
        table, timeout = _parse_options(url, options.storage_options)
        return SqliteSource(
            database_path(url),
            table=table,
            timeout=timeout,
            rank=options.rank,
            writable=options.writable,
            verify=options.verify,
            poll_interval=options.poll_interval,
        )

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            with _sqlite_errors("open the database", where=self.path):
                self.path.parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(
                    self.path,
                    timeout=self.timeout,
                    # None: no implicit transactions; this sink says BEGIN and COMMIT
                    # itself, so the transaction is exactly one step.
                    isolation_level=None,
                    # rlwire runs each slice of work in whichever worker thread is
                    # free; it never runs two at once on one sink.
                    check_same_thread=False,
                )
                try:
                    # WAL: readers never block the writer and never wait for it, and a
                    # reader sees a step either before or after its COMMIT, never during.
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
                    conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {self.table} ("
                        "step INTEGER NOT NULL, rank INTEGER NOT NULL, "
                        "main BLOB NOT NULL, sidecar BLOB, PRIMARY KEY (step, rank))"
                    )
                except BaseException:
                    conn.close()
                    raise
            self._conn = conn
        return self._conn

    def open(self, on_existing: OnExisting, start_step: int | None = None) -> int:
        conn = self._connect()
        low = start_step or 0
        with _sqlite_errors("read the steps already stored", where=self._where):
            ended = conn.execute(
                f"SELECT step FROM {self.table} WHERE rank = {END_RANK}"
            ).fetchone()
            if on_existing != "error":
                # A sender that continues or replaces the stream removes its end mark.
                conn.execute(f"DELETE FROM {self.table} WHERE rank = {END_RANK}")
            if on_existing in ("overwrite", "truncate"):
                # One statement is one transaction: a reader sees every old step or none,
                # never a step with some of its ranks gone.
                conn.execute(
                    f"DELETE FROM {self.table} WHERE step >= ?",
                    (low if on_existing == "truncate" else 0,),
                )
                return low
            first, last = conn.execute(
                f"SELECT min(step), max(step) FROM {self.table} WHERE step >= ? AND rank >= 0",
                (low,),
            ).fetchone()
            before = conn.execute(
                f"SELECT max(step) FROM {self.table} WHERE step < ? AND rank >= 0", (low,)
            ).fetchone()[0]
        if on_existing == "resume" and start_step is None:
            # Steps are committed whole, so the last one stored is complete: unlike a
            # directory of files, there is no torn step to detect here.
            return 0 if last is None else int(last) + 1
        if last is not None:
            raise StepExistsError(
                f"holds steps {first}..{last} from an earlier run; open the sender with "
                + (
                    "on_existing='overwrite' to delete them or on_existing='resume' to "
                    "continue after them"
                    if start_step is None
                    else f"start_step={start_step}, on_existing='truncate' to delete them"
                ),
                where=self._where,
            )
        if on_existing == "error" and ended is not None:
            raise StepExistsError(
                "holds the end mark of a finished stream; open the sender with "
                "on_existing='resume' to continue it",
                where=self._where,
            )
        if on_existing == "resume" and before is not None and before < low - 1:
            raise StepExistsError(
                f"cannot resume at start_step {low}: the last stored step is {before}, "
                "so the steps between would be a hole",
                where=self._where,
            )
        return low

    def finish(self, end: int) -> None:
        conn = self._connect()
        with _sqlite_errors("mark the end of the stream", where=self._where):
            conn.execute(
                f"INSERT INTO {self.table} (step, rank, main) VALUES (?, {END_RANK}, x'')",
                (end,),
            )

    def stage(self, step: int, frames: Sequence[PendingFrame]) -> Sliced[Staged]:
        conn = self._connect()
        with _sqlite_errors("start a transaction", where=self._where, step=step):
            # IMMEDIATE takes the write lock now, before any work: a second writer on
            # the same database waits `timeout` seconds here and then fails cleanly.
            conn.execute("BEGIN IMMEDIATE")
        staged = _SqliteStaged(conn, self._where, step)
        rank: int | None = None  # the rank being written, for the error context
        try:
            # Checked before anything is written. The primary key would catch it too,
            # but only when the insert is reached, after the checksums were computed.
            if conn.execute(
                f"SELECT 1 FROM {self.table} WHERE step = ? LIMIT 1", (step,)
            ).fetchone():
                raise StepExistsError("already exists", where=self._where, step=step)
            for rank, pending in enumerate(frames):
                # The sender encodes each rank only now, in slices; taking the frames
                # one by one keeps one rank's encoded message in memory at a time.
                frame = yield from take_frame(pending)
                # Checksums first, in slices (each slice hashes at most 64 MiB with the
                # GIL released), then the layout that records them.
                sums = (yield from checksum_segments(frame)) if self.checksum else None
                layout = plan(frame, step, rank, sums)
                yield from self._insert(conn, step, rank, layout.main, layout.sidecar)
        except BaseException as exc:
            # Also reached when rlwire closes this generator because the send was
            # cancelled: the rollback removes every row this step inserted.
            staged.discard()
            if isinstance(exc, sqlite3.Error):
                err = transport_error(exc, "write", where=self._where)
                raise err.add_context(step=step, rank=rank) from exc
            raise
        return staged

    def _insert(
        self,
        conn: sqlite3.Connection,
        step: int,
        rank: int,
        main: Sequence[bytes | memoryview],
        sidecar: Sequence[bytes | memoryview],
    ) -> Sliced[None]:
        """Insert the row of one rank: reserve BLOBs of the right size with ``zeroblob``,
        then stream the layout's chunks into them. Streaming through the incremental
        BLOB API means no chunk is ever joined into one large ``bytes`` object."""
        main_size = sum(memoryview(c).nbytes for c in main)
        side_size = sum(memoryview(c).nbytes for c in sidecar) if sidecar else None
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        if max(main_size, side_size or 0) > limit:
            raise TransportError(
                f"needs a {max(main_size, side_size or 0)}-byte BLOB; this SQLite stores at "
                f"most {limit} bytes in one value (send it with sidecar= to split it, or use "
                "another sink)",
                where=self._where,
                step=step,
                rank=rank,
            )
        cur = conn.execute(
            f"INSERT INTO {self.table} (step, rank, main, sidecar) VALUES (:step, :rank, "
            "zeroblob(:main), CASE WHEN :side IS NULL THEN NULL ELSE zeroblob(:side) END)",
            {"step": step, "rank": rank, "main": main_size, "side": side_size},
        )
        rowid = cur.lastrowid
        assert rowid is not None  # an INSERT of one row always sets it
        yield from self._write_blob(conn, rowid, "main", main)
        if sidecar:
            yield from self._write_blob(conn, rowid, "sidecar", sidecar)

    def _write_blob(
        self,
        conn: sqlite3.Connection,
        rowid: int,
        column: str,
        chunks: Sequence[bytes | memoryview],
    ) -> Sliced[None]:
        # The order of main and sidecar does not matter: the transaction makes them
        # visible together, which is stronger than the sidecar-first rule files need.
        slicer = SliceTimer()
        with conn.blobopen(self.table, column, rowid) as blob:
            for chunk in chunks:
                view = _byte_view(chunk)
                for start in range(0, view.nbytes, CHUNK_BYTES):
                    blob.write(view[start : start + CHUNK_BYTES])
                    if slicer.due():
                        yield
                        slicer.restart()

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            # Closing rolls back a transaction that is still open: nothing half-written.
            conn.close()


class SqliteSource(Source):
    """Reads one rank's messages from the table a :class:`SqliteSink` writes.

    Polls: a SQLite database cannot wake a reader in another process, so :meth:`wait`
    sleeps ``poll_interval`` between reads. A read is one indexed ``SELECT``. Arrays
    are views over the bytes that ``SELECT`` returned; nothing is copied again.

    Args:
        path: the database file. It need not exist yet: a receiver may start before
            the sender, and reads return ``None`` until the step is committed.
        table: the table the sink writes (storage option ``table``).
        timeout: seconds to wait for a lock before failing (storage option ``timeout``).
        rank: the data-parallel rank to read.
        writable: hand out writable buffers (a copy of each message).
        verify: check every segment against its recorded checksum.
        poll_interval: seconds between reads while waiting for a step.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        table: str = DEFAULT_TABLE,
        timeout: float = DEFAULT_TIMEOUT,
        rank: int = 0,
        writable: bool = False,
        verify: bool = True,
        poll_interval: float = 0.01,
    ) -> None:
        self.path = Path(path)
        self.table, self.timeout = _parse_options(
            str(self.path), {"table": table, "timeout": timeout}
        )
        self.rank = rank
        self.writable = writable
        self.verify = verify
        self.poll_interval = poll_interval
        self._conn: sqlite3.Connection | None = None
        self._table_exists = False

    def __repr__(self) -> str:
        return f"SqliteSource({str(self.path)!r}, table={self.table!r}, rank={self.rank})"

    @property
    def _where(self) -> str:
        return f"{self.path} table {self.table}"

    def describe(self, step: int) -> str:
        # The receiver adds this as the `where` of errors in decoding the message; it
        # names the step and rank already, so str() does not repeat them.
        return f"{self._where}, step {step}, rank {self.rank}"

    def _connect(self) -> sqlite3.Connection | None:
        """The connection, or None while the database does not exist yet."""
        if self._conn is None:
            if not self.path.exists():
                return None
            with _sqlite_errors("open the database", where=self.path):
                # mode=rw: never create the file (that is the sender's job). Not mode=ro:
                # a WAL reader writes to the shared-memory index beside the database.
                conn = sqlite3.connect(
                    self.path.absolute().as_uri() + "?mode=rw",
                    uri=True,
                    timeout=self.timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                # A reader must never change what the sender wrote, even by mistake.
                conn.execute("PRAGMA query_only=ON")
                # A value some other tool stored as TEXT comes back as bytes, for
                # parse_main to judge, instead of failing to decode as UTF-8.
                conn.text_factory = bytes
            self._conn = conn
        return self._conn

    def read(self, step: int) -> Frame | None:
        conn = self._connect()
        if conn is None:
            return None
        with _sqlite_errors("read", where=self._where, step=step, rank=self.rank):
            if not self._table_exists:
                # The sender creates the table when it opens; until then nothing is sent.
                self._table_exists = bool(
                    conn.execute(
                        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (self.table,),
                    ).fetchone()
                )
                if not self._table_exists:
                    return None
            # One statement reads main and sidecar from one snapshot of the database,
            # so they always belong to the same committed message.
            row = conn.execute(
                f"SELECT main, sidecar FROM {self.table} WHERE step = ? AND rank = ?",
                (step, self.rank),
            ).fetchone()
        if row is None:
            self._check_end(conn, step)
            return None
        main, sidecar = row
        if not isinstance(main, bytes) or not isinstance(sidecar, bytes | None):
            raise CorruptFrameError(
                "the row does not hold BLOBs", where=self._where, step=step, rank=self.rank
            )

        def load_sidecar() -> memoryview:
            # parse_main calls this only for a message whose buffers are in a sidecar.
            if sidecar is None:
                raise CorruptFrameError(
                    "the message has a sidecar; the row has none",
                    where=self._where,
                    step=step,
                    rank=self.rank,
                )
            return self._view(sidecar)

        return parse_main(
            self._view(main),
            step=step,
            rank=self.rank,
            load_sidecar=load_sidecar,
            where=self.describe(step),
            verify=self.verify,
        )

    def _check_end(self, conn: sqlite3.Connection, step: int) -> None:
        """Raise EndOfStream if the sender finished before ``step``."""
        with _sqlite_errors("read", where=self._where, step=step, rank=self.rank):
            mark = conn.execute(f"SELECT step FROM {self.table} WHERE rank = {END_RANK}").fetchone()
        if mark is not None and step >= mark[0]:
            raise EndOfStream(
                f"the sender finished the stream before step {mark[0]}", where=self._where
            )

    def _view(self, data: bytes) -> memoryview:
        # bytes are read-only; a writable receiver gets one copy it may change freely.
        return memoryview(bytearray(data) if self.writable else data)

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
