"""What the ZeroMQ sink and source both do with sockets: the endpoint a URL names, CURVE
keys and the authenticator, waiting on a socket's edge-triggered descriptor, and
releasing a socket with its context."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias, cast

import anyio
import zmq
import zmq.auth

from rlwire._core.errors import ConfigError, TransportError
from rlwire.transport._url import URL

__all__ = [
    "HANDSHAKE_EVENTS",
    "RETRY_SECONDS",
    "Context",
    "Socket",
    "check_handshake",
    "connect_curve",
    "curve_key",
    "curve_server_keys",
    "endpoint",
    "ensure_ipc_free",
    "has_packet",
    "option_key",
    "release",
    "start_authenticator",
    "wait_descriptor",
]

Socket: TypeAlias = "zmq.Socket[bytes]"
Context: TypeAlias = "zmq.Context[zmq.Socket[bytes]]"

#: What the monitor of a CURVE client's socket reports: the handshake's outcome.
HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)

#: Longest a sender or receiver sleeps between checks of a full queue, a missing
#: receiver or a closed socket; the socket's descriptor usually wakes it sooner.
RETRY_SECONDS = 0.05


def endpoint(url: URL) -> str:
    """The ZeroMQ endpoint ``url`` names.

    Raises:
        ConfigError: not a ``zmq+tcp://host:port`` or ``zmq+ipc:///path`` URL.

    Example:
        >>> from rlwire.transport import parse_url
        >>> endpoint(parse_url("zmq+tcp://127.0.0.1:5555")), endpoint(parse_url("zmq+ipc:///r"))
        ('tcp://127.0.0.1:5555', 'ipc:///r')
    """
    parts = url.parts
    transport = parts.scheme.removeprefix("zmq+")
    if transport == "tcp":
        try:
            port = parts.port
        except ValueError as exc:  # a port that is not a number, or out of range
            raise ConfigError(f"a zmq+tcp URL needs a valid port: {exc}", where=url) from None
        if not parts.hostname or port is None:
            raise ConfigError("a zmq+tcp URL needs a host and a port", where=url)
        return f"tcp://{parts.netloc}"
    if transport == "ipc":
        path = parts.netloc + parts.path
        if not path:
            raise ConfigError("a zmq+ipc URL needs a path (zmq+ipc:///tmp/run.sock)", where=url)
        return f"ipc://{path}"
    raise ConfigError("ZeroMQ URLs are zmq+tcp://host:port or zmq+ipc:///path", where=url)


def ensure_ipc_free(endpoint: str) -> None:
    """Refuse to bind an ``ipc://`` endpoint that another socket is listening on: libzmq
    would unlink that socket's file and bind anyway, leaving the other sender alive but
    unreachable. A file no one listens on (left by a process that died) may be bound.
    Abstract addresses (``ipc://@name``) and TCP are left to the kernel, which refuses
    an address in use by itself.

    Anything but a socket at the path (a regular file, a directory) is refused too:
    libzmq would delete it.

    Raises:
        TransportError: something listens on the path.
        ConfigError: the path names something other than a socket.
    """
    path = endpoint.removeprefix("ipc://")
    if not endpoint.startswith("ipc://") or path.startswith("@"):
        return
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # nothing there (or nothing this process may see): bind says what fails
    if not stat.S_ISSOCK(mode):
        raise ConfigError(
            "cannot bind: the ipc path exists and is not a socket (binding would delete "
            "it); name a path of its own, e.g. /tmp/run42.sock",
            where=endpoint,
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        return  # refused, or not a socket: no one listens there
    finally:
        with contextlib.suppress(OSError):
            probe.close()
    raise TransportError(
        "cannot bind: address in use (another sender listens on this ipc path)",
        where=endpoint,
    )


def curve_key(value: object, name: str) -> bytes:
    """``value`` as a Z85 CURVE key (``str`` or ``bytes``), from storage option ``name``.

    Raises:
        ConfigError: not a 40-character Z85 key.
    """
    key = value.encode() if isinstance(value, str) else value
    if not isinstance(key, bytes) or len(key) != 40:
        raise ConfigError(
            f"storage option {name!r} must hold 40-character Z85 CURVE keys "
            "(as zmq.curve_keypair() makes)"
        )
    return key


def option_key(options: Mapping[str, Any], name: str) -> bytes | None:
    """Storage option ``name`` as a CURVE key, or ``None`` if it is not given."""
    value = options.get(name)
    return None if value is None else curve_key(value, name)


def curve_server_keys(
    url: URL, options: Mapping[str, Any]
) -> tuple[bytes | None, list[bytes] | None]:
    """A sender's ``curve_secret_key`` and ``curve_clients`` storage options, checked:
    a ``curve_public_key`` must belong to the secret key, and clients need one.

    Raises:
        ConfigError: a malformed key, or keys that do not go together.
    """
    secret = option_key(options, "curve_secret_key")
    public = option_key(options, "curve_public_key")
    if public is not None and (secret is None or zmq.curve_public(secret) != public):
        raise ConfigError(
            "curve_public_key must come with the curve_secret_key it belongs to", where=url
        )
    clients = options.get("curve_clients")
    if clients is None:
        return secret, None
    if secret is None:
        raise ConfigError("curve_clients needs curve_secret_key", where=url)
    if isinstance(clients, str | bytes) or not isinstance(clients, Iterable):
        raise ConfigError(
            "storage option 'curve_clients' must be a list of Z85 public keys, "
            f"got {type(clients).__name__}",
            where=url,
        )
    return secret, [curve_key(key, "curve_clients") for key in clients]


def start_authenticator(context: Context, clients: frozenset[bytes] | None) -> Any:
    """Start the ZAP authenticator that CURVE needs on a sender's ``context``: it admits
    any receiver that knows the sender's public key, or only ``clients`` if given. Stop
    it (``.stop()``) before terminating the context."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(context)
    auth.start()
    if clients is None:
        auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
    else:
        allowed = clients

        class _Allowed:
            def callback(self, domain: str, key: bytes) -> bool:
                return key in allowed

        auth.configure_curve_callback(domain="*", credentials_provider=_Allowed())
    return auth


def connect_curve(
    sock: Socket, server_key: bytes, public_key: bytes | None, secret_key: bytes | None
) -> None:
    """Make ``sock`` a CURVE client of the sender whose public key is ``server_key``, with
    the key pair given or, when none is, a fresh one."""
    if public_key is None or secret_key is None:
        public_key, secret_key = zmq.curve_keypair()
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public_key)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret_key)


def has_packet(sock: Socket) -> bool:
    """True if a packet (a multipart ZeroMQ message) waits on ``sock``. Reading
    ``ZMQ_EVENTS`` also re-arms the socket's edge-triggered descriptor, so call this
    after every wake-up."""
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


async def wait_descriptor(sock: Socket, timeout: float | None) -> None:
    """Wait for ``sock``'s descriptor to signal a change (a packet in, room in a queue),
    at most ``timeout`` seconds. The descriptor is edge-triggered: check
    :func:`has_packet` first, or a change that came before is never signalled."""
    with anyio.move_on_after(timeout):
        await anyio.wait_readable(cast(int, sock.getsockopt(zmq.FD)))


def check_handshake(monitor: Socket, *, where: str, curve: bool = True) -> None:
    """Read the handshake events that ``monitor`` (of a CURVE client's socket, watching
    :data:`HANDSHAKE_EVENTS`, or, ``curve`` false, of a plain one, watching
    ``EVENT_HANDSHAKE_FAILED_PROTOCOL``) has queued, without waiting.

    Raises:
        TransportError: a handshake failed: authentication failed, or a plain receiver
            met a sender that uses CURVE (or a peer that speaks another protocol).
    """
    from zmq.utils.monitor import parse_monitor_message

    while True:
        try:
            message = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return
        event, value = message["event"], message["value"]
        if not curve:
            if event != zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                continue
            if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                why = (
                    "the sender uses CURVE: open the receiver with storage option "
                    "curve_server_key (the sender's public key)"
                )
            else:
                why = f"ZeroMQ protocol error {value:#x}: is an rlwire sender at this address?"
            raise TransportError(f"the handshake with the sender failed: {why}", where=where)
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            why = "the sender refused this receiver's key (not among its curve_clients)"
        elif event != zmq.EVENT_HANDSHAKE_SUCCEEDED:
            why = (
                "the handshake with the sender failed: is curve_server_key the sender's "
                "public key, and does the sender use CURVE?"
            )
        else:
            continue
        raise TransportError(f"CURVE authentication failed: {why}", where=where)


def release(
    sock: Socket, context: Context, auth: Any, *, linger: int | None, monitor: Socket | None = None
) -> None:
    """Close ``sock``, letting ZeroMQ send what is queued for ``linger`` milliseconds
    (``None``: the socket's own setting), and its ``monitor`` if it has one, stop the
    authenticator if there is one, and terminate ``context``."""
    if monitor is not None:
        with contextlib.suppress(zmq.ZMQError):
            sock.disable_monitor()
        monitor.close(linger=0)
    sock.close(linger=linger)
    if auth is not None:
        auth.stop()
    context.term()
