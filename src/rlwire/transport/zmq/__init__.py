"""ZeroMQ sink and source: ``zmq+tcp://host:port`` and ``zmq+ipc:///path``.

The sender binds a ROUTER socket; each receiver connects a DEALER socket and announces
itself with a *ready* packet naming its rank, so the sender knows who is there before
it sends step 0 and a receiver that starts late misses nothing. Two patterns:

``ranks`` (default)
    per-rank fan-out: ``send_ranks(objs)`` sends ``objs[r]`` only to the receiver of
    rank ``r``, and waits until every rank has announced itself.
``shared``
    one producer, consumers sharing work: each step goes to one consumer, the next one
    whose queue has room, so a slow consumer gets less.

Everything on the socket travels as *packets*, each one multipart ZeroMQ message. A
*message* (a step's payload for one receiver) is one or more *data packets* of about
``message_bytes`` each, then a *seal* packet. A data packet is a small *head* (magic,
version, session, step, sequence number, rank, codec, per-segment compression, its place
in the message), then the message's next segments (the codec's header, the out-of-band
buffers), sent zero-copy. The seal carries every segment's checksum: the sender hashes
each data packet while ZeroMQ sends it, and the receiver each one while the next arrives,
since ZeroMQ moves a packet only once it is all queued. A receiver returns a message only
once sealed; a sender stopped midway says so with an ``abort`` packet. Every message to a
receiver carries the next sequence number of the sender's session, so a receiver detects
a lost message and raises :class:`~rlwire.errors.StepGapError` instead of training on a
hole.
High-water marks bound the packets queued per receiver; a full queue makes the sender
wait, never drop. A send returns once ZeroMQ has released the message's buffers (handed
them to the kernel), so the caller may reuse its arrays. Receivers acknowledge what they
read, and closing a sender waits until every receiver that is still there has read
everything sent to it (up to ``linger`` seconds in all): ZeroMQ itself drops what a slow
receiver had not yet taken off its connection when the sender closes it.

Sockets are driven by the task that holds the sender, waiting on the socket's
edge-triggered file descriptor with :func:`anyio.wait_readable` and re-reading
``ZMQ_EVENTS`` after every wake-up: the same code runs under asyncio, uvloop and trio.

The modules, one concept each:

``_protocol``
    the data packets exactly as docs/format.md ("ZeroMQ messages") specifies them
``_control``
    the control packets (a kind and a body: ``ready``, ``seal``, ``end`` …), likewise
``_peers``
    the sender's bookkeeping of its receivers: handshake, ranks, acknowledgements
``_ranks``
    which receiver serves each rank, and which ones a newer receiver replaced
``_complaints``
    what a sender says when it cannot reach its receivers
``_sockets``
    endpoints, CURVE keys, waiting on a socket's descriptor
``_reassembly``
    a receiver puts a message back together from its data packets and checks it
``_ordering``
    a receiver places each message against the one it expects next
``_waiting``
    how a receiver waits for the next packet, never past its next announcement
``_sink`` / ``_source``
    :class:`ZmqSink` and :class:`ZmqSource`
"""

from rlwire._core.faces import claim
from rlwire.transport.zmq._sink import ZmqSink
from rlwire.transport.zmq._source import ZmqSource

__all__ = ["ZmqSink", "ZmqSource"]

claim(__name__, globals(), __all__)
