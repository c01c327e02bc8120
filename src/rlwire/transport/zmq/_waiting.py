"""How a receiver waits for its sender's next packet: in short polls, and never past the
time it announces itself again.

A wait ends by :data:`~rlwire.transport.zmq._control.REANNOUNCE_SECONDS` at the latest,
so that the next read re-announces the receiver to a sender that restarted (else a
blocking receive would wait for ever); it polls in slices of
:data:`~rlwire.transport.zmq._sockets.RETRY_SECONDS`, so that a source closed from
another thread meanwhile is noticed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq

from rlwire.transport.zmq._control import REANNOUNCE_SECONDS
from rlwire.transport.zmq._sockets import RETRY_SECONDS, Socket, has_packet, wait_descriptor

__all__ = ["await_packet", "wait_for_packet"]


def wait_for_packet(
    socket: Callable[[], Socket | None], lock: threading.Lock, timeout: float | None
) -> None:
    """Block until a packet waits on ``socket()`` (``None``: closed, return at once), for
    ``timeout`` seconds at most (``None``: no limit), and no longer than a re-announcement
    is due. Each poll holds ``lock``, the source's, since the socket is used by one thread
    at a time."""
    deadline = _deadline(timeout)
    while (remaining := deadline - time.monotonic()) > 0:
        with lock:
            sock = socket()
            if sock is None or sock.poll(
                max(1, int(min(remaining, RETRY_SECONDS) * 1000)), zmq.POLLIN
            ):
                return


async def await_packet(socket: Callable[[], Socket | None], timeout: float | None) -> None:
    """:func:`wait_for_packet` without blocking the event loop: on the socket's
    descriptor."""
    deadline = _deadline(timeout)
    while (remaining := deadline - time.monotonic()) > 0:
        sock = socket()
        try:
            if sock is None or has_packet(sock):
                return
            await wait_descriptor(sock, min(remaining, RETRY_SECONDS))
        except zmq.ZMQError:
            return  # closed meanwhile: the next read says so


def _deadline(timeout: float | None) -> float:
    """When a wait of ``timeout`` seconds ends: never later than a re-announcement is due."""
    limit = REANNOUNCE_SECONDS if timeout is None else min(timeout, REANNOUNCE_SECONDS)
    return time.monotonic() + limit
