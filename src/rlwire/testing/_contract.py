"""The contract suite every sink passes; :mod:`rlwire.testing` is its face."""

from __future__ import annotations

from rlwire._api.synthetic import assert_batches_equal, make_batch, make_sample
from rlwire.testing._checksums import ChecksumsContract
from rlwire.testing._columns import ColumnsContract
from rlwire.testing._delivery import DeliveryContract
from rlwire.testing._fields import FieldsContract
from rlwire.testing._parts import PartsContract
from rlwire.testing._pieces import PiecesContract
from rlwire.testing._retention import RetentionContract
from rlwire.testing._stored import StoredContract

__all__ = ["SinkContract", "assert_batches_equal", "make_batch", "make_sample"]


class SinkContract(
    DeliveryContract,
    ChecksumsContract,
    StoredContract,
    RetentionContract,
    PiecesContract,
    ColumnsContract,
    PartsContract,
    FieldsContract,
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
    hypothesis is not installed), and a step of thousands of small samples, whose
    columns are several runs each. A sink that stores steps part by part
    (:attr:`rlwire.abc.Sink.stores_parts`) must deliver every rank's parts in commit
    order and the sealed step whole; any other must refuse ``open_step`` with ConfigError.
    On a store, parts also keep the writer's assignment (by cost, or a forced rank), a
    key once per step, an open step resumed with its committed keys skipped, a whole
    step held back until its seal, ``EndOfStream`` after ``finish()``, and parts read
    ``as_columns``.

    Partial reads hold on every sink: ``fields=`` returns just those columns, of whole
    steps and of parts, and a field the step lacks is named (at once on a stream; a
    sink that can append fields waits for it and names it in its timeout). A sink that
    keeps messages to be read again makes a manifest (rows, columns, sizes, checksums)
    and reads row ranges by it; one that cannot says so with ConfigError. A sink with
    :attr:`rlwire.abc.Sink.appends_fields` takes ``add_fields`` on a committed step,
    checked against its rows and lengths, and hands the fields to a receiver that
    waited for them; any other refuses ``add_fields`` with ConfigError.
    """
