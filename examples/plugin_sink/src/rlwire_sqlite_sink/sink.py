"""An rlwire sink that stores every message as rows of BLOBs in a SQLite database.

``open_sender("sqlite:///path/to/run.db")`` writes here once this package is installed:
its ``pyproject.toml`` registers :class:`SqliteSink` under the ``sqlite`` URL scheme in
the ``rlwire.sinks`` entry point group, and ``open_receiver`` with the same URL reads
through :class:`SqliteSource`.

Both build on rlwire's stored layout (:mod:`rlwire.transport.layout`): rlwire names the
files of each step and rank (``step-00000003.rank-0001.rlw`` and its sidecar file), the
end-of-stream mark and the ranks' consumption marks, lays out their bytes (versions,
checksums, the sidecar split) and decides where a sender starts, what it deletes and
what retention removes. This module only stores named files, one row each, in a table
(``rlwire_messages`` unless the ``table`` storage option names another)::

    name TEXT PRIMARY KEY | data BLOB

How the sink keeps rlwire's promise that nothing is ever half-visible: every row of a
step is inserted under a hidden temporary name, and ``commit`` renames them all in one
transaction, so the step appears for all ranks at once. A cancelled or failed send
deletes its rows; rows a crash or ``kill -9`` left behind are hidden from readers, and
the next sender opened with ``on_existing="resume"``, ``"truncate"`` or ``"overwrite"``
deletes them.

Errors are rlwire's own: ``ConfigError`` for a bad URL or option, ``StepExistsError`` for
a step already stored, ``CorruptFrameError`` for a damaged row, and ``TransportError``
for whatever SQLite or the OS refuses, naming the database file and table.

SQLite is a single-machine store: its locks do not work on network filesystems, so use
this sink when sender and trainers share one host (``file://`` or ``s3://`` otherwise).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from rlwire import ConfigError, CorruptFrameError, RlwireError, StepExistsError, TransportError
from rlwire.abc import URL, SinkOptions, Sliced, SliceTimer, SourceOptions
from rlwire.transport import parse_url, reject_unknown, transport_error
from rlwire.transport.layout import StoredSink, StoredSource, StoredStaging

__all__ = ["DEFAULT_TABLE", "DEFAULT_TIMEOUT", "SqliteSink", "SqliteSource", "sqlite_url"]

#: The table messages go to unless the ``table`` storage option names another.
DEFAULT_TABLE = "rlwire_messages"
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
def _sqlite_errors(action: str, where: object, *, step: int | None = None) -> Iterator[None]:
    """Turn what SQLite and the OS raise inside the block into rlwire's TransportError,
    which callers of ``send`` and ``receive`` already handle: ``transport_error`` says
    what could not be done and keeps the errno, and the context says where."""
    try:
        yield
    except RlwireError:
        raise  # already one of rlwire's (StepExistsError is an OSError too)
    except (sqlite3.Error, OSError) as exc:
        raise transport_error(exc, action, where=where).add_context(step=step) from exc


class _Table:
    """What the sink and its source share: the database file, the table, and names."""

    path: Path
    table: str
    timeout: float

    def _setup(self, path: str | Path, table: str, timeout: float) -> None:
        self.path = Path(path)
        self.table, self.timeout = _parse_options(
            str(self.path), {"table": table, "timeout": timeout}
        )

    def locate(self, name: str | None = None) -> str:
        """Database and table (several runs may share one database file), and the row."""
        where = f"{self.path} table {self.table}"
        return where if name is None else f"{where} row {name}"

    def _load(self, conn: sqlite3.Connection, name: str) -> bytes | None:
        with _sqlite_errors("read", self.locate(name)):
            row = conn.execute(f"SELECT data FROM {self.table} WHERE name = ?", (name,)).fetchone()
        if row is not None and not isinstance(row[0], bytes):
            raise CorruptFrameError("the row does not hold a BLOB", where=self.locate(name))
        return None if row is None else row[0]

    def _save(self, conn: sqlite3.Connection, name: str, data: bytes) -> None:
        conn.execute(
            f"INSERT OR REPLACE INTO {self.table} (name, data) VALUES (?, ?)", (name, data)
        )


class _SqliteStaging(StoredStaging):
    """A step whose rows are inserted under hidden temporary names (``.<name>.<hex>.tmp``,
    which readers never ask for) and renamed in one transaction at commit."""

    def __init__(self, conn: sqlite3.Connection, table: str, where: str) -> None:
        self._conn = conn
        self._table = table
        self._where = where
        self._rows: list[tuple[str, str]] = []  # (temporary, final), sidecar files first

    def add(self, name: str, chunks: Sequence[bytes | memoryview], *, main: bool) -> Sliced[None]:
        """Insert the row: reserve a BLOB of the right size with ``zeroblob``, then stream
        the chunks into it, so that no chunk is ever joined into one large ``bytes``. Each
        statement commits on its own: the write lock is never held between slices, so
        receivers can record their consumption marks meanwhile."""
        views = [memoryview(c).cast("B") for c in chunks]
        size = sum(v.nbytes for v in views)
        limit = self._conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
        if size > limit:
            raise TransportError(
                f"needs a {size}-byte BLOB; this SQLite stores at most {limit} bytes in one "
                "value (send it with sidecar= to split it, or use another sink)",
                where=f"{self._where} row {name}",
            )
        tmp = f".{name}.{os.urandom(6).hex()}.tmp"  # what StoredSink cleans up after a kill
        cur = self._conn.execute(
            f"INSERT INTO {self._table} (name, data) VALUES (?, zeroblob(?))", (tmp, size)
        )
        self._rows.append((tmp, name))  # from here on, discard() deletes it
        assert cur.lastrowid is not None  # an INSERT of one row always sets it
        slicer = SliceTimer()
        with self._conn.blobopen(self._table, "data", cur.lastrowid) as blob:
            for view in views:
                for start in range(0, view.nbytes, CHUNK_BYTES):
                    blob.write(view[start : start + CHUNK_BYTES])
                    if slicer.due():
                        yield
                        slicer.restart()

    def commit(self) -> None:
        # One transaction renames every row: the whole step appears at once, for every
        # rank, which is stronger than the sidecar-first rule files need.
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            for tmp, name in self._rows:
                self._conn.execute(f"UPDATE {self._table} SET name = ? WHERE name = ?", (name, tmp))
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # A transaction that fails to commit is rolled back: no rank sees anything,
            # so `visible` stays False and the sender may retry the step.
            self.discard()
            action = "commit (nothing was made visible)"
            raise transport_error(exc, action, where=self._where) from exc
        self.visible = True

    def discard(self) -> None:
        # Best effort: rows left behind are hidden, and the next sender's open removes them.
        with contextlib.suppress(sqlite3.Error):
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            tmps = [tmp for tmp, _ in self._rows]
            marks = ", ".join("?" * len(tmps))
            self._conn.execute(f"DELETE FROM {self._table} WHERE name IN ({marks})", tmps)


class SqliteSink(_Table, StoredSink):
    """Writes each step as rows of one table in a SQLite database, one row per file.

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
        self._setup(path, table, timeout)
        self.fsync = fsync
        self.checksum = checksum
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"SqliteSink({str(self.path)!r}, table={self.table!r})"

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
                # isolation_level=None: no implicit transactions, so that a transaction
                # is exactly one step. check_same_thread=False: rlwire runs each slice of
                # work in whichever worker thread is free, never two at once on one sink.
                conn = sqlite3.connect(
                    self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
                )
                try:
                    # WAL: readers never block the writer and never wait for it, and a
                    # reader sees a step either before or after its COMMIT, never during.
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
                    conn.execute(
                        f"CREATE TABLE IF NOT EXISTS {self.table} "
                        "(name TEXT PRIMARY KEY, data BLOB NOT NULL)"
                    )
                except BaseException:
                    conn.close()
                    raise
            self._conn = conn
        return self._conn

    # The primitives StoredSink builds open, stage, finish and retention on.

    def prepare(self) -> None:
        self._connect()

    def names(self) -> list[str]:
        return [row[0] for row in self._connect().execute(f"SELECT name FROM {self.table}")]

    def existing(self, names: Sequence[str]) -> list[int]:
        marks = ", ".join("?" * len(names))
        query = f"SELECT name FROM {self.table} WHERE name IN ({marks})"
        found = {row[0] for row in self._connect().execute(query, tuple(names))}
        return [i for i, name in enumerate(names) if name in found]

    def load(self, name: str) -> bytes | None:
        return self._load(self._connect(), name)

    def save(self, name: str, data: bytes) -> None:
        self._save(self._connect(), name, data)

    def remove(self, names: Sequence[str]) -> None:
        # One statement is one transaction: a reader sees all of these rows or none.
        marks = ", ".join("?" * len(names))
        self._connect().execute(f"DELETE FROM {self.table} WHERE name IN ({marks})", tuple(names))

    def staging(self, step: int) -> StoredStaging:
        return _SqliteStaging(self._connect(), self.table, self.locate())

    def step_exists(self, step: int, rank: int) -> StepExistsError:
        return StepExistsError("already exists", where=self.locate(), step=step)

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()  # rolls back a transaction still open: nothing half-written


class SqliteSource(_Table, StoredSource):
    """Reads one rank's messages from the table a :class:`SqliteSink` writes.

    Polls: a SQLite database cannot wake a reader in another process, so :meth:`wait`
    sleeps ``poll_interval`` between reads. A read is one indexed ``SELECT`` per file.
    Arrays are views over the bytes that ``SELECT`` returned; nothing is copied again.

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
        self._setup(path, table, timeout)
        self.rank = rank
        self.writable = writable
        self.verify = verify
        self.poll_interval = poll_interval
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        return f"SqliteSource({str(self.path)!r}, table={self.table!r}, rank={self.rank})"

    def _connect(self) -> sqlite3.Connection | None:
        """The connection, or None while the sender has not made the table yet."""
        if self._conn is None:
            if not self.path.exists():
                return None
            with _sqlite_errors("open the database", where=self.path):
                # mode=rw: never create the file (that is the sender's job). The source
                # writes only its rank's consumption mark, when asked to record one.
                conn = sqlite3.connect(
                    self.path.absolute().as_uri() + "?mode=rw",
                    uri=True,
                    timeout=self.timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                # A value some other tool stored as TEXT comes back as bytes, to be
                # judged by the layout's parser, instead of failing to decode as UTF-8.
                conn.text_factory = bytes
                found = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                    (self.table,),
                ).fetchone()
            if not found:
                conn.close()
                return None
            self._conn = conn
        return self._conn

    def load(self, name: str) -> memoryview | None:
        conn = self._connect()
        data = None if conn is None else self._load(conn, name)
        if data is None:
            return None
        # bytes are read-only; a writable receiver gets one copy it may change freely.
        return memoryview(bytearray(data) if self.writable else data)

    def stored_steps(self) -> list[int] | None:
        """The steps stored for this rank: how a receiver at a step ``keep_last``
        deleted learns so (``StepGapError``) instead of waiting for it."""
        conn = self._connect()
        if conn is None:
            return []
        with _sqlite_errors("list the steps", self.locate()):
            rows = conn.execute(
                f"SELECT name FROM {self.table} WHERE name LIKE 'step-%'"
            ).fetchall()
        # text_factory is bytes: names come back as bytes.
        names = [n.decode() if isinstance(n, bytes) else str(n) for (n,) in rows]
        return self.steps_among(names)

    def save(self, name: str, data: bytes) -> None:
        conn = self._connect()
        with _sqlite_errors("record what this rank consumed", self.locate(name)):
            if conn is None:
                raise sqlite3.OperationalError("the sender has not made the table yet")
            self._save(conn, name, data)

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
