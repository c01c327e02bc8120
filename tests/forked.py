"""Child processes forked from a warm interpreter, for the tests that start many.

Each child is a real process of its own (its pid, its sockets, its signals and exit
code), forked from a server process that imported numpy, msgspec, anyio, trio, pyzmq and
rlwire once, where a new interpreter imports them again: some 0.6 CPU-s a child on this
machine, most of what the tests of processes and of ZeroMQ cost. :func:`Popen` and
:func:`run` take the arguments of :mod:`subprocess`'s for the ``python -c CODE ARGS``
form; anything else (a script, ``-m``, interpreter flags) starts a new interpreter as
before.

A child takes the test's environment, directory and umask; ``PYTHONPATH`` given to it
goes to the front of its ``sys.path``, as a new interpreter would put it. What it does
not redo: the imports above, done once with the server's environment (rlwire reads no
environment variable at import), the server's hash seed and resource limits. Its
standard streams are line-buffered. Signals reach it through a pidfd, never another
process that took its pid. The server dies with the pytest process that started it
(the end of a pipe it holds); its children stay as a subprocess's would.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import io
import json
import os
import select
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["Popen", "run"]

TESTS = Path(__file__).resolve().parent
_PRELOAD = (
    "numpy",
    "msgspec",
    "anyio",
    "anyio._backends._asyncio",
    "anyio._backends._trio",
    "trio",
    "zmq",
    "zmq.asyncio",
    "rlwire",
    "rlwire.aio",
    "rlwire.testing",
    "rlwire.transport.zmq",
    "helpers",
)
_LEN = struct.Struct("<I")


def _send(conn: socket.socket, obj: object, fds: Sequence[int] = ()) -> None:
    data = json.dumps(obj).encode()
    message = _LEN.pack(len(data)) + data
    if fds:
        socket.send_fds(conn, [message], list(fds))
    else:
        conn.sendall(message)


def _receive(conn: socket.socket, nfds: int = 0) -> tuple[Any, list[int]]:
    """One message and the file descriptors that came with it; (None, []) at the end."""
    head, fds, _, _ = socket.recv_fds(conn, _LEN.size, nfds) if nfds else (conn.recv(4), [], 0, 0)
    if not head:
        return None, []
    while len(head) < _LEN.size:
        head += conn.recv(_LEN.size - len(head))
    (size,) = _LEN.unpack(head)
    data = b""
    while len(data) < size:
        more = conn.recv(size - len(data))
        if not more:
            raise EOFError("the fork server's message was cut short")
        data += more
    return json.loads(data), list(fds)


# -- the server ----------------------------------------------------------------------


def _serve(path: str) -> dict[str, Any]:
    """Fork a child per request until the client goes; in each child, return its request
    (with ``sys`` and the standard streams set up as the child's)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    # Standard input is a pipe the test process holds open: at its end (that process
    # gone, whichever of its threads started this one), the server goes too.
    selector.register(sys.stdin, selectors.EVENT_READ)
    waiting: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, conn)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                os._exit(0)
            if key.fileobj is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn, 3)
                except (OSError, EOFError, ValueError):
                    request, fds = None, []
                if request is None:  # a client gone before its request was whole
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    for fd, (_, other) in list(waiting.items()):
                        os.close(fd)
                        other.close()
                    selector.close()
                    listener.close()
                    conn.close()
                    _become(request, fds)
                    return request
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                waiting[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ)
                # The client signals the child through its own copy of the pidfd: never
                # another process that took the pid once this one was reaped.
                with contextlib.suppress(OSError):  # the client went: the child goes on
                    _send(conn, {"pid": pid}, [pidfd])
            else:
                pidfd = int(key.fd)
                pid, conn = waiting.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the test process stopped listening
                    _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
                conn.close()


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """Turn this forked server into the requested child: its streams, directory,
    environment, arguments and path."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.umask(request["umask"])
    # The tests' modules the server imported are the test's to import, as in a new
    # interpreter (which finds them only on a path the child is given).
    for name in ("helpers", "forked"):
        sys.modules.pop(name, None)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        line_buffering=True,
        errors="backslashreplace",
    )
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = ["", *extra, *(p for p in sys.path[1:] if p not in extra)]
    sys.argv[:] = ["-c", *request["args"]]


def _server_main(path: str) -> None:
    request = _serve(path)
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    try:
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # as `python -c`: the traceback, status 1
        code = 1
    else:
        code = 0
    _exit(code)


def _exit_code(exc: SystemExit) -> int:
    """The exit status the interpreter makes of ``exc`` (a message: printed, 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """End the child as the interpreter ends, in what a test can see (the threads that
    are not daemons joined, then atexit, then the standard streams flushed), without
    tearing down the modules and objects it shares with the server: that touches the
    whole heap, a copy of every page (some 0.25 CPU-s a child)."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


# -- the client ----------------------------------------------------------------------


class _Server:
    """The fork server of this test process, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: str | None = None
        self._proc: subprocess.Popen[str] | None = None

    def path(self) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                directory = tempfile.mkdtemp(prefix="rlwire-forked-")
                self._path = os.path.join(directory, "server.sock")
                code = (
                    "import sys; sys.path.insert(0, sys.argv[1]); import forked\n"
                    f"for name in {_PRELOAD!r}: __import__(name)\n"
                    "forked._server_main(sys.argv[2])\n"
                )
                self._proc = subprocess.Popen(
                    [sys.executable, "-c", code, str(TESTS), self._path],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert self._proc.stdout is not None
                ready = self._proc.stdout.readline()
                assert ready == "ready\n", f"the fork server did not start: {ready!r}"
                atexit.register(self._stop, self._proc, directory)
            assert self._path is not None
            return self._path

    @staticmethod
    def _stop(proc: subprocess.Popen[str], directory: str) -> None:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        shutil.rmtree(directory, ignore_errors=True)


_SERVER = _Server()


def _forkable(args: Sequence[str], options: Mapping[str, Any]) -> bool:
    known = {"stdin", "stdout", "stderr", "text", "env", "cwd", "universal_newlines"}
    return (
        len(args) >= 3
        and args[0] == sys.executable
        and args[1] == "-c"
        and set(options) <= known
        and options.get("stderr") != subprocess.STDOUT
    )


def Popen(args: Sequence[str], **options: Any) -> Any:
    """A child like ``subprocess.Popen(args, **options)``, forked from the warm server
    when ``args`` is ``[sys.executable, "-c", code, ...]``; a new interpreter otherwise."""
    if not _forkable(args, options):
        return subprocess.Popen(args, **options)
    return _Forked(list(args), **options)


def run(
    args: Sequence[str],
    *,
    input: str | bytes | None = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **options: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run``, the child forked as :func:`Popen` forks it."""
    if capture_output:
        options["stdout"] = options["stderr"] = subprocess.PIPE
    if input is not None:
        options["stdin"] = subprocess.PIPE
    with Popen(args, **options) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, args, out, err)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


class _Forked:
    """The part of :class:`subprocess.Popen` the tests use, for a forked child."""

    def __init__(
        self,
        args: list[str],
        *,
        stdin: Any = None,
        stdout: Any = None,
        stderr: Any = None,
        text: bool = False,
        universal_newlines: bool = False,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.args = args
        self.returncode: int | None = None
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        self._text = text or universal_newlines
        theirs: list[int] = []
        close_after: list[int] = []
        self._lock = threading.Lock()  # one reader of the server's answer at a time
        self._readers: list[threading.Thread] | None = None  # communicate()'s
        self._read: dict[str, Any] = {}
        self._pidfd = -1
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for index, how in enumerate((stdin, stdout, stderr)):
                fd, mine = self._stream(index, how, close_after)
                theirs.append(fd)
                if mine is not None:
                    setattr(self, ("stdin", "stdout", "stderr")[index], mine)
            umask = os.umask(0o022)
            os.umask(umask)
            request = {
                "code": args[2],
                "args": args[3:],
                "env": dict(os.environ if env is None else env),
                "cwd": os.fspath(os.getcwd() if cwd is None else cwd),
                "umask": umask,
            }
            self._conn.connect(_SERVER.path())
            _send(self._conn, request, theirs)
            answer, fds = _receive(self._conn, 1)
            if answer is None or not fds:
                raise RuntimeError("the fork server went away before it forked the child")
        except BaseException:
            self._conn.close()
            for stream in (self.stdin, self.stdout, self.stderr):
                if stream is not None:
                    stream.close()
            raise
        finally:
            for fd in close_after:
                os.close(fd)
        self.pid: int = answer["pid"]
        self._pidfd = fds[0]

    def _stream(self, index: int, how: Any, close_after: list[int]) -> tuple[int, IO[Any] | None]:
        """The descriptor the child gets as stream ``index``, and this side's end."""
        if how is None:
            return index, None
        if how == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            close_after.append(fd)
            return fd, None
        if how == subprocess.PIPE:
            read, write = os.pipe()
            theirs, mine = (read, write) if index == 0 else (write, read)
            close_after.append(theirs)
            mode = "wb" if index == 0 else "rb"
            raw: IO[Any] = open(mine, mode)  # noqa: SIM115 (closed with the process)
            if self._text:
                raw = io.TextIOWrapper(raw, encoding="utf-8", write_through=index == 0)
            return theirs, raw
        if isinstance(how, int):
            return how, None
        return how.fileno(), None

    def poll(self) -> int | None:
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                if self.returncode is None:
                    self._answer(0.0)
            except subprocess.TimeoutExpired:
                pass
            finally:
                self._lock.release()
        return self.returncode

    def _answer(self, timeout: float | None) -> None:
        """Take the exit status from the server, within ``timeout`` seconds (None: no
        limit); the caller holds the lock. A message of a few bytes comes whole."""
        ready = select.select([self._conn], [], [], timeout)[0] if timeout is not None else True
        if not ready:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        answer, _ = _receive(self._conn)
        if answer is None:
            raise RuntimeError("the fork server went away before the child ended")
        self.returncode = int(answer["returncode"])
        self._conn.close()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            try:
                if self.returncode is None:
                    self._answer(timeout)
            finally:
                self._lock.release()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # Through the pidfd, kept until this object goes: once the child is reaped it
        # refers to no process (ProcessLookupError), never to one that took the pid.
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(
        self, input: str | bytes | None = None, timeout: float | None = None
    ) -> tuple[Any, Any]:
        """As Popen's: may be called again after a TimeoutExpired (the same readers go
        on); an error reading a stream is raised here."""
        read = self._read
        if self._readers is None:

            def drain(name: str, stream: IO[Any]) -> None:
                try:
                    read[name] = stream.read()
                except BaseException as exc:  # raised in the caller's thread
                    read[name + " error"] = exc
                finally:
                    stream.close()

            self._readers = [
                threading.Thread(target=drain, args=(name, stream), daemon=True)
                for name, stream in (("out", self.stdout), ("err", self.stderr))
                if stream is not None
            ]
            for reader in self._readers:
                reader.start()
            if self.stdin is not None and not self.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    if input:
                        self.stdin.write(input)
                    self.stdin.close()
        self.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        for name in ("out", "err"):
            if name + " error" in read:
                raise read[name + " error"]
        return read.get("out"), read.get("err")

    def __del__(self) -> None:
        # The connection to the server is this class's own, not a subprocess's: it goes
        # quietly with the object, as a Popen's exit status would.
        conn = getattr(self, "_conn", None)
        if conn is not None:
            conn.close()
        if getattr(self, "_pidfd", -1) >= 0:
            os.close(self._pidfd)
            self._pidfd = -1

    def __enter__(self) -> _Forked:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None:
                with contextlib.suppress(BrokenPipeError):
                    stream.close()
        self.wait()
