"""The contract suite every sink passes; :mod:`rlwire.testing` is its face."""

from __future__ import annotations

from rlwire._api.synthetic import assert_batches_equal, make_batch, make_sample
from rlwire.testing._columns import ColumnsContract
from rlwire.testing._delivery import DeliveryContract
from rlwire.testing._parts import PartsContract
from rlwire.testing._pieces import PiecesContract
from rlwire.testing._retention import RetentionContract
from rlwire.testing._stored import StoredContract

__all__ = ["SinkContract", "assert_batches_equal", "make_batch", "make_sample"]


class SinkContract(
    DeliveryContract,
    StoredContract,
    RetentionContract,
    PiecesContract,
    ColumnsContract,
    PartsContract,
):
    """The behaviour every sink shares, as pytest tests; subclass it to run them.

    Provide a ``sink_url`` fixture (a fresh URL per test); optionally override the
    ``sender_options`` and ``receiver_options`` fixtures (the ``storage_options`` of the
    sender and of the receivers) and :attr:`persistent`.

    Receivers are opened before anything is sent and sends run beside the receives, so
    the same tests fit stores (files, objects) and streams (sockets, which may wait for
    their receivers before sending).

    Besides delivery, stored steps and retention, it checks what a sink is handed since
    lists are stored as columns: a buffer given as :class:`~rlwire.abc.Pieces` arrives
    as its runs joined, whether the sink gathers them (:attr:`rlwire.abc.Sink.gathers`)
    or the sender joins them; and a hypothesis property sends lists of Structs and
    dicts of any mix of fields, dtypes, lengths and missing fields, a
    :class:`~rlwire.Ragged` and a :class:`~rlwire.Chunked`, received typed and with
    ``as_columns=True`` (:attr:`columns_examples` values per backend; skipped when
    hypothesis is not installed). A sink that stores steps part by part
    (:attr:`rlwire.abc.Sink.stores_parts`) must deliver every rank's parts in commit
    order and the sealed step whole; any other must refuse ``open_step`` with ConfigError.
    """
