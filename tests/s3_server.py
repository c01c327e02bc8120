"""A moto S3 server on loopback for the tests, in its own process.

``s3_endpoint`` (session scope) starts ``python -m moto.server`` on 127.0.0.1 and gives
the fsspec storage options that reach it; ``s3_url`` makes a fresh bucket per test and
gives its ``s3://`` URL; ``s3_proxy`` puts a :class:`FaultProxy` in front of the
server, to fail chosen requests. Nothing leaves 127.0.0.1: the credentials are moto's dummies.
"""

from __future__ import annotations

import contextlib
import functools
import http
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import fsspec
import pytest

__all__ = [
    "DROP_REPLY",
    "ERROR_IN_200",
    "HOLD",
    "NOT_IMPLEMENTED",
    "PASS",
    "RESET",
    "FaultProxy",
    "cancelled_while_held",
    "claim_size",
    "file_or_s3",
    "moto_server",
    "refuse",
    "s3_client",
    "s3_endpoint",
    "s3_proxy",
    "s3_url",
    "short_reads",
]

#: Dummy credentials moto accepts; set for the server and given to clients explicitly.
_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never ask an EC2 metadata service for credentials or a region.
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _free_port() -> int:
    # moto.server cannot report the port it bound when given 0, so pick one here; the
    # gap before the server binds it is tiny, and a collision fails loudly below.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: ``python -m moto.server``, with the list of moto's packages read once: moto lists its
#: package's directory (a ``stat`` per service, some 200) twice for every request, a
#: quarter of the server's CPU per request here (2026-12-01).
_SERVE = """
import functools, sys
import moto.backends
from moto.server import main

listed = getattr(moto.backends, "list_of_moto_modules", None)
if listed is not None:
    moto.backends.list_of_moto_modules = functools.cache(lambda: tuple(listed()))
main(sys.argv[1:])
"""


@contextlib.contextmanager
def moto_server(timeout: float = 30.0) -> Iterator[str]:
    """Run moto's standalone server in a subprocess; yield its endpoint URL; kill it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **_CREDENTIALS}
    # The server logs every request: to a file, since a pipe nobody reads fills up and
    # then blocks the server mid-request.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    err = log.read().decode(errors="replace")
                    raise RuntimeError(f"moto server exited with {proc.returncode}: {err[-2000:]}")
                try:
                    with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                        break
                except urllib.error.HTTPError:
                    break  # it answered
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"moto server did not answer on {url}") from None
                    time.sleep(0.05)
            yield url
        finally:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[dict[str, Any]]:
    """fsspec storage options (for s3fs) that reach a moto server on loopback."""
    with moto_server() as url:
        yield {
            "endpoint_url": url,
            "key": _CREDENTIALS["AWS_ACCESS_KEY_ID"],
            "secret": _CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"region_name": _CREDENTIALS["AWS_DEFAULT_REGION"]},
        }


def s3_client(options: dict[str, Any]) -> Any:
    """A plain boto3 client for ``options``: tests check what is stored through it,
    independently of s3fs and its caches. One client per endpoint and key, made once:
    making one took 70-170 ms here, in every test that makes a bucket (boto3's clients
    are safe to share between threads)."""
    return _client(
        options["endpoint_url"],
        options["key"],
        options["secret"],
        options["client_kwargs"]["region_name"],
    )


@functools.cache
def _client(endpoint_url: str, key: str, secret: str, region: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=region,
    )


@pytest.fixture
def s3_url(s3_endpoint: dict[str, Any]) -> str:
    """``s3://<fresh bucket>``: a new, empty bucket on the moto server for each test."""
    bucket = f"rlwire-{uuid.uuid4().hex[:16]}"
    s3_client(s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}"


@pytest.fixture(params=["file", "s3"])
def file_or_s3(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """``(url, storage_options)`` of a store that keeps steps: a new directory, then a
    new bucket on the test session's S3 server (``run`` under each)."""
    if request.param == "file":
        return str(tmp_path / "run"), {}
    return f"{request.getfixturevalue('s3_url')}/run", request.getfixturevalue("s3_endpoint")


# ------------------------------------------------------------------ fault injection

#: What :class:`FaultProxy` does with one request: forward it, reset the connection
#: before the server sees it, or forward it and reset the connection instead of
#: returning the server's reply (the request lands, its reply is lost).
PASS, RESET, DROP_REPLY = "pass", "reset", "drop-reply"
#: Hold the request, unanswered, until :meth:`FaultProxy.release` (many requests then
#: fail at the same moment), then reset its connection.
HOLD = "hold"
#: Forward the request, and answer ``200 OK`` whose body is S3's ``InternalError``
#: instead of the server's reply, as S3 may answer a CompleteMultipartUpload (botocore
#: sends it again): the request landed, its reply is garbled.
ERROR_IN_200 = "error-in-200"


def refuse(status: int, code: str) -> str:
    """The action that answers a request (its body read) with S3's error ``status`` /
    ``code``, as a store refusing it would; the server never sees the request."""
    return f"refuse {status} {code}"


def claim_size(size: int) -> str:
    """The action that forwards a request and relays the server's reply with the total
    of its ``Content-Range`` header replaced by ``size``, as a proxy that lies about an
    object's size would (the body is the server's)."""
    return f"claim-size {size}"


#: Answer with S3's 501 ``NotImplemented``, as a store that does not implement a header
#: it was sent does.
NOT_IMPLEMENTED = refuse(501, "NotImplemented")
#: The ``Message`` of each refusal's error, by code (S3's wording where S3 has one).
_MESSAGES = {
    "NotImplemented": "A header you provided implies functionality that is not implemented",
    "InternalError": "We encountered an internal error. Please try again.",
    "PreconditionFailed": "At least one of the pre-conditions you specified did not hold",
    "NoSuchUpload": "The specified upload does not exist. The upload ID may be invalid, "
    "or the upload may have been aborted or completed.",
}


class FaultProxy:
    """An HTTP proxy on loopback in front of the moto server that fails chosen requests.

    ``fault(method, target)`` (``target`` is the request line's path and query, e.g.
    ``/bucket/key?uploadId=...``) decides what happens to each request: :data:`PASS`,
    :data:`RESET`, :data:`DROP_REPLY`, :data:`HOLD` or :data:`NOT_IMPLEMENTED`; ``None``
    means :data:`PASS`. It
    runs in the proxy's threads, one per connection. Setting
    :attr:`down` resets every request (an outage). :attr:`seen` records
    ``(method, target, action)`` of every request.

    Each request gets its own connection to the server (the proxy asks for
    ``Connection: close``), so a fault hits exactly one request. ``Expect:
    100-continue`` is answered by the proxy itself, so that a dropped reply drops the
    server's whole answer.

    Use it as a context manager; :attr:`options` are storage options that reach the
    server through it, with botocore's own retries off (s3fs still retries).

    ``atomic_conditions``: forward the requests that carry ``If-None-Match`` one at a
    time, each until its reply is relayed. moto checks such a condition and then
    writes, not atomically (two commits of one new key at once can both succeed, the
    later replacing the earlier), where S3 refuses all but one: through this proxy moto
    does as S3 does, for tests of many writers committing at once.
    """

    def __init__(self, options: dict[str, Any], *, atomic_conditions: bool = False) -> None:
        self.upstream = options["endpoint_url"].removeprefix("http://").rpartition(":")
        self.atomic_conditions = atomic_conditions
        self._one_condition = threading.Lock()
        self.fault: Any = None
        self.conditional: str | None = None
        self.down = False
        self.seen: list[tuple[str, str, str]] = []
        #: ``(method, target, Range header or None)`` of every request.
        self.ranges: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        port = self._listener.getsockname()[1]
        self.options: dict[str, Any] = {
            **options,
            "endpoint_url": f"http://127.0.0.1:{port}",
            # A connect on loopback is made or refused at once, save on a loaded machine,
            # where 2 s ran out once (a fresh clone's test command, 2026-12-01).
            "config_kwargs": {"retries": {"total_max_attempts": 1}, "connect_timeout": 10},
        }
        self._stop = threading.Event()
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._released.set()
        self._thread.join(5)
        self._listener.close()

    def release(self) -> None:
        """Reset every held request (and any request held from now on) at once."""
        self._released.set()

    def requests(self, method: str | None = None) -> list[tuple[str, str, str]]:
        """What :attr:`seen` holds (of ``method`` only, if given)."""
        with self._lock:
            return [s for s in self.seen if method is None or s[0] == method]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _decide(self, method: str, target: str, conditional: bool) -> str:
        if self.down:
            action = RESET
        elif conditional and self.conditional:
            action = self.conditional
        else:
            action = self.fault(method, target) if self.fault else None
        action = action or PASS
        with self._lock:
            self.seen.append((method, target, action))
        return str(action)

    def _handle(self, client: socket.socket) -> None:
        sockets = [client]  # closed at the end: the client's, and the server's
        try:
            client.settimeout(30)
            data = _read_head(client)
            if _END_OF_HEAD not in data:
                return
            head, _, rest = data.partition(_END_OF_HEAD)
            lines = head.decode("latin-1").split("\r\n")
            method, target = lines[0].split(" ")[:2]
            fields = {
                k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
            }
            with self._lock:
                self.ranges.append((method, target, fields.get("range")))
            action = self._decide(method, target, "if-none-match" in fields)
            if action == HOLD:
                self._released.wait(30)
            if action in (RESET, HOLD):
                _reset(client)
                return
            if action.startswith("refuse "):
                _, status, code = action.split(" ")
                _refuse(client, fields, rest, int(status), code)
                return
            one = self.atomic_conditions and "if-none-match" in fields
            with self._one_condition if one else contextlib.nullcontext():
                self._forward(sockets, lines, rest, method, action)
        except OSError:
            pass
        finally:
            for s in sockets:
                with contextlib.suppress(OSError):
                    s.close()

    def _forward(
        self, sockets: list[socket.socket], lines: list[str], rest: bytes, method: str, action: str
    ) -> None:
        """Send the request to the server and relay its reply to ``sockets[0]`` (the
        client), as ``action`` says; the connection to the server is added to
        ``sockets``."""
        client = sockets[0]
        kept = [
            line
            for line in lines[1:]
            if line.partition(":")[0].strip().lower() not in ("connection", "expect")
        ]
        expect = any(line.lower().startswith("expect: 100-continue") for line in lines)
        out = "\r\n".join([lines[0], *kept, "Connection: close"]) + "\r\n\r\n"
        host, _, port = self.upstream
        upstream = socket.create_connection((host, int(port)), timeout=30)
        sockets.append(upstream)
        upstream.sendall(out.encode("latin-1") + rest)
        if expect:
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        pump = threading.Thread(target=_pump, args=(client, upstream), daemon=True)
        pump.start()
        if action == DROP_REPLY:
            _read_reply(upstream, method)
            # Wake the pump's recv first: a socket another thread reads from is not
            # really closed (no reset sent) until that read returns.
            client.shutdown(socket.SHUT_RD)
            pump.join(5)
            _reset(client)
            return
        if action == ERROR_IN_200:
            _read_reply(upstream, method)
            client.sendall(_error_reply(200, "InternalError"))
            client.shutdown(socket.SHUT_RD)
            pump.join(5)
            return
        if action.startswith("claim-size "):
            _relay_claiming(upstream, client, action.partition(" ")[2])
        _pump(upstream, client)


_END_OF_HEAD = b"\r\n\r\n"


def _read_head(sock: socket.socket, data: bytes = b"") -> bytes:
    """``data`` and what ``sock`` sends after it, up to and past the end of an HTTP
    head (all of it if the connection ends first)."""
    while _END_OF_HEAD not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _relay_claiming(upstream: socket.socket, client: socket.socket, size: str) -> None:
    """Relay the reply's head from ``upstream`` to ``client``, the total of its
    ``Content-Range`` replaced by ``size``; the body is left for the pump."""
    head, sep, body = _read_head(upstream).partition(_END_OF_HEAD)
    head = re.sub(rb"(?im)^(content-range:[^/\r\n]*/)\d+", rb"\g<1>" + size.encode(), head)
    client.sendall(head + sep + body)


def _read_reply(sock: socket.socket, method: str) -> None:
    """Read one whole HTTP reply from ``sock`` (interim 1xx replies skipped)."""
    data = b""
    while True:
        data = _read_head(sock, data)
        if _END_OF_HEAD not in data:
            return
        head, _, data = data.partition(_END_OF_HEAD)
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].split(" ")[1].startswith("1"):
            break
    fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    if method == "HEAD":
        return
    if "chunked" in fields.get("transfer-encoding", ""):
        while not data.endswith(b"0\r\n\r\n") and (chunk := sock.recv(65536)):
            data += chunk
        return
    left = int(fields.get("content-length", "0")) - len(data)
    while left > 0 and (chunk := sock.recv(min(left, 65536))):
        left -= len(chunk)


def _refuse(
    client: socket.socket, fields: dict[str, str], rest: bytes, status: int, code: str
) -> None:
    """Read the request's body from ``client`` (``fields``: its header, lower-case
    names), then answer it with S3's error ``status`` / ``code``."""
    if fields.get("expect", "").lower() == "100-continue":
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    left = int(fields.get("content-length", "0")) - len(rest)
    while left > 0 and (chunk := client.recv(min(left, 65536))):
        left -= len(chunk)
    client.sendall(_error_reply(status, code))


def _error_reply(status: int, code: str) -> bytes:
    """A whole HTTP reply of status ``status`` whose body is S3's error ``code``."""
    message = _MESSAGES.get(code, f"refused by the test's proxy ({code})")
    # S3 names the failed condition; s3fs then raises FileExistsError.
    extra = "<Condition>If-None-Match</Condition>" if code == "PreconditionFailed" else ""
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message>{extra}</Error>"
    ).encode()
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
        f"Content-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either closes."""
    with contextlib.suppress(OSError):
        while chunk := src.recv(65536):
            dst.sendall(chunk)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (SO_LINGER 0), as a failing network does."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def short_reads(proxy: FaultProxy) -> dict[str, Any]:
    """The proxy's options with botocore's read timeout cut to 4 s, s3fs's retries off:
    a request the proxy holds fails in seconds, not minutes."""
    options = {**proxy.options}
    options["config_kwargs"] = {**options["config_kwargs"], "read_timeout": 4}
    fsspec.filesystem("s3", **options).retries = 1
    return options


async def cancelled_while_held(
    proxy: FaultProxy,
    work: Callable[[], Awaitable[Any]],
    holds: Callable[[str, str], bool],
    quiet: tuple[type[BaseException], ...] = (),
) -> tuple[float, anyio.CancelScope]:
    """Run ``work``, hold the first request ``holds(method, target)`` picks, cancel
    ``work`` 0.1 s into that wait, and give the seconds it took to end once cancelled and
    its cancel scope (``quiet``: errors ``work`` may end with instead). The proxy's fault
    is cleared; the held request is left for the caller to release."""
    held: list[str] = []

    def fault(method: str, target: str) -> str | None:
        if held or not holds(method, target):
            return None
        held.append(target)
        return HOLD

    scope = anyio.CancelScope()

    async def run() -> None:
        with scope, contextlib.suppress(*quiet):
            await work()

    proxy.fault = fault
    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        with anyio.fail_after(30):  # a loaded machine reaches the request late
            while not held:
                await anyio.sleep(0.01)
        await anyio.sleep(0.1)  # inside the held request's wait
        start = time.monotonic()
        scope.cancel()
    took = time.monotonic() - start
    proxy.fault = None
    return took, scope


@pytest.fixture
def s3_proxy(s3_endpoint: dict[str, Any]) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of the session's moto server."""
    with FaultProxy(s3_endpoint) as proxy:
        yield proxy
