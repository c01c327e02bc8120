"""rlwire-sqlite-sink: an example rlwire plugin that adds the ``sqlite://`` URL scheme.

Installed, it lets ``rlwire.open_sender("sqlite:///path/to/run.db")`` and
``rlwire.open_receiver(...)`` with the same URL move batches through a SQLite database.
See :mod:`rlwire_sqlite_sink.sink` and this example's README.
"""

from .sink import DEFAULT_TABLE, DEFAULT_TIMEOUT, SqliteSink, SqliteSource, sqlite_url

__all__ = ["DEFAULT_TABLE", "DEFAULT_TIMEOUT", "SqliteSink", "SqliteSource", "sqlite_url"]
