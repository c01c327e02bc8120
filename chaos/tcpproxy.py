"""A TCP proxy on loopback whose connections can be cut and restored: a network blip, for
real, between a ZeroMQ sender and its receivers.

One thread accepts connections on a free port of 127.0.0.1 and pumps bytes both ways
between each one and a new connection to the upstream address. :meth:`TcpProxy.cut`
closes every connection (both sides see the peer go away, as after a cable pulled and put
back, or a NAT entry dropped) and refuses new ones until :meth:`TcpProxy.restore`:
ZeroMQ then reconnects by itself.

Example:
    >>> with TcpProxy(("127.0.0.1", 9)) as proxy:
    ...     proxy.port > 0
    True
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from types import TracebackType

__all__ = ["TcpProxy"]

_CHUNK = 1 << 16


class TcpProxy:
    """Listens on ``127.0.0.1:<port>`` and forwards to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: dict[socket.socket, socket.socket] = {}  # both directions
        self._open = True  # False while cut: connections are refused
        self._stop = False
        self.cuts = 0
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Close every connection, and refuse new ones until :meth:`restore`."""
        with self._lock:
            self._open = False
            self.cuts += 1
        self._poke()

    def restore(self) -> None:
        """Accept connections again."""
        with self._lock:
            self._open = True
        self._poke()

    def close(self) -> None:
        self._stop = True
        self._poke()
        self._thread.join(5)
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop:
                for key, _ in sel.select(0.1):
                    if key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    elif key.data == "accept":
                        self._accept(sel)
                    else:
                        self._pump(sel, key.fileobj)  # type: ignore[arg-type]
                with self._lock:
                    closing = not self._open
                if closing:
                    for sock in list(self._pairs):
                        self._drop(sel, sock)
        finally:
            for sock in list(self._pairs):
                self._drop(sel, sock)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        with self._lock:
            refuse = not self._open
        if refuse:
            _reset(client)
            return
        try:
            server = socket.create_connection(self.upstream, timeout=2)
        except OSError:
            _reset(client)
            return
        for sock in (client, server):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._pairs[client], self._pairs[server] = server, client
        sel.register(client, selectors.EVENT_READ, "pump")
        sel.register(server, selectors.EVENT_READ, "pump")

    def _pump(self, sel: selectors.BaseSelector, sock: socket.socket) -> None:
        other = self._pairs.get(sock)
        if other is None:
            return
        try:
            data = sock.recv(_CHUNK)
            if not data:
                raise ConnectionResetError
            other.setblocking(True)  # simple: a slow side slows the other
            other.settimeout(5)
            other.sendall(data)
            other.setblocking(False)
        except OSError:
            self._drop(sel, sock)

    def _drop(self, sel: selectors.BaseSelector, sock: socket.socket) -> None:
        other = self._pairs.pop(sock, None)
        for s in (sock, other):
            if s is None:
                continue
            self._pairs.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(s)
            _reset(s)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (SO_LINGER 0), as a dropped connection looks."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
