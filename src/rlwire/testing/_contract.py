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
    sender and of the receivers), :attr:`persistent` and :attr:`timeout` (30 s: how
    long a test waits for what should happen, a step, a part, the end of the stream;
    a sink that never delivers it fails the test then, without hanging the run).

    Receivers are opened before anything is sent and sends run beside the receives, so
    the same tests fit stores (files, objects) and streams (sockets, which may wait for
    their receivers before sending).

    Delivery means every step once, in order, each rank its own payload; never a step
    read in part while it is written (a receiver polls throughout a send of 27 MB);
    arrays read-only to numpy unless the receiver is ``writable=True``, whose writes
    never reach the store; and checksums passed through: a step sent with
    ``checksum=True`` arrives verified (:attr:`rlwire.Frame.verified`, which a source
    of your own sets once it checked every segment); a step that fails its checks,
    for one rank of several too, reaches no rank, and its number delivers the step
    sent in its place to every rank. Retention means ``keep_last``
    deletes only what every rank moved past, and a receiver at a deleted step gets
    :class:`~rlwire.StepGapError`, not a wait.

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
    order and the sealed step whole, also to a rank that skipped a step it was left out
    of just before; any other must refuse ``open_step`` with ConfigError.
    On a store, parts also keep the writer's assignment (by cost, or a forced rank), a
    key once per step, an open step resumed with its committed keys skipped, a part
    readable once its ``put`` returns, a whole step held back until its seal and
    whole once sealed, ``EndOfStream`` after ``finish()``, and parts read
    ``as_columns``.

    Partial reads hold on every sink: ``fields=`` returns just those columns (each its
    own bytes, in the header or out-of-band), of whole steps and of parts, and a field
    the step lacks is named (at once on a stream; a sink that can append fields waits
    for it and names it in its timeout). A sink that keeps messages to be read again
    makes a manifest (rows, columns, sizes, checksums) and reads row ranges by it; one
    that cannot says so with ConfigError. A sink with
    :attr:`rlwire.abc.Sink.appends_fields` takes ``add_fields`` on a committed step,
    checked against its rows and lengths, and hands the fields to a receiver that
    waited for them; any other refuses ``add_fields`` with ConfigError.

    ``tests/transport/test_contract_catches.py`` in rlwire runs the contract against
    sinks with one planted defect each (a step delivered twice, ranks mixed up, a step
    visible while written, half a step left
    visible when one rank failed, bytes changed after their checksum, checksums dropped,
    retention that deletes too much or too little, no end mark, parts out of order or
    after their seal, Pieces runs misplaced, wrong columns, writable mappings) and
    checks that it fails each.
    """
