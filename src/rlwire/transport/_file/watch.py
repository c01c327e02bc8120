"""DirectoryWatch: wakes a reader that waits on a local directory as soon as a file
appears in it, through Linux's inotify; elsewhere, and whenever inotify cannot be had,
waiting is plain sleeping (the reader polls).

inotify is reached through ctypes, three calls of the C library (``inotify_init1``,
``inotify_add_watch``, ``read``): a dependency for them would weigh more than they do,
and watchfiles (a Rust thread, debounced by 50 ms) would add latency where it should
remove it.

A wait never lasts longer than it is asked to, events or not, so a reader still checks
at its poll interval: files written on another machine of a network filesystem (NFS,
SMB, most FUSE mounts) raise no event here, and are found by that check.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import select
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import anyio

__all__ = ["DirectoryWatch"]

# From <sys/inotify.h>.
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_UNMOUNT = 0x00002000
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
#: What makes a file appear under its final name: a rename (``os.replace``,
#: ``renameat2``), a hard link (how rlwire moves a step into place without replacing
#: one), or a file written in place and closed.
_MASK = _IN_MOVED_TO | _IN_CREATE | _IN_CLOSE_WRITE | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
#: The watch no longer follows the directory at its path: watch it again.
_GONE = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_UNMOUNT | _IN_IGNORED
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows
#: Seconds between two attempts to set a watch up, after one failed (no such directory
#: yet, the per-user limit of instances or watches reached).
_RETRY_SECONDS = 1.0


def _libc_inotify() -> tuple[Callable[..., int], Callable[..., int]] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init1, add_watch = libc.inotify_init1, libc.inotify_add_watch
    except (AttributeError, OSError):
        return None
    init1.argtypes, init1.restype = [ctypes.c_int], ctypes.c_int
    add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    add_watch.restype = ctypes.c_int
    return init1, add_watch


_INOTIFY = _libc_inotify()


def _close(fd: int, pid: int) -> None:
    if os.getpid() == pid:  # a forked child's copy of a finalizer leaves the parent's be
        os.close(fd)


class DirectoryWatch:
    """Waits, at most a given time, for a file to appear in the directory ``path``.

    Files whose names start with a dot (rlwire's temporary files) do not count. The
    inotify instance is made on the first wait, after which that wait returns at once:
    whatever appeared before the watch was set is for the caller to look for. Only one
    waiter at a time uses the instance; any other one meanwhile, in another thread or
    task, sleeps. :meth:`close` releases the instance (a waiter that holds it releases
    it as it returns); so does a forked child, which sets up its own rather than share
    its parent's queue of events.

    Args:
        path: the directory.
        enabled: False: never use inotify; every wait sleeps its whole time.
        ignore: name prefixes that do not count either (a receiver need not wake for
            another rank's consumption mark).
    """

    def __init__(self, path: Path, *, enabled: bool = True, ignore: tuple[str, ...] = ()) -> None:
        self.path = path
        self.enabled = enabled and _INOTIFY is not None
        self._ignore = (b".", *(prefix.encode() for prefix in ignore))
        self._slot = threading.Lock()  # held by the one waiter that uses the instance
        self._closed = False
        self._fd: int | None = None
        self._pid = os.getpid()
        self._poller: select.poll | None = None
        self._finalizer: weakref.finalize[..., DirectoryWatch] | None = None
        self._stale = False  # the directory was removed, moved or unmounted
        self._next_try = 0.0

    @property
    def watching(self) -> bool:
        """True while an inotify watch of the directory is set up in this process."""
        return self._fd is not None and self._pid == os.getpid() and not self._stale

    def wait(self, timeout: float) -> None:
        """Block until a file appears in the directory, or ``timeout`` seconds pass."""
        if not self._enter():
            time.sleep(timeout)
            return
        try:
            fd = self._arm()
            if fd == -1:
                return
            if fd is None or self._poller is None:
                time.sleep(timeout)
                return
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if self._poller.poll(math.ceil(left * 1000)) and self._drain(fd):
                    return
        finally:
            self._leave()

    async def await_change(self, timeout: float) -> None:
        """:meth:`wait` without blocking the event loop (and without a thread)."""
        if not self._enter():
            await anyio.sleep(timeout)
            return
        try:
            fd = self._arm()
            if fd == -1:
                return
            if fd is None:
                await anyio.sleep(timeout)
                return
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                with anyio.move_on_after(left):
                    await anyio.wait_readable(fd)
                if self._drain(fd):
                    return
        finally:
            self._leave()

    def close(self) -> None:
        """Release the inotify instance, now or as its waiter returns. Idempotent."""
        self._closed = True
        self._after_fork()
        if self._slot.acquire(blocking=False):
            try:
                self._release()
            finally:
                self._slot.release()

    def _enter(self) -> bool:
        """Take the instance for one wait; False if another waiter has it, or none may
        be used."""
        if not self.enabled or self._closed:
            return False
        self._after_fork()
        return self._slot.acquire(blocking=False)

    def _after_fork(self) -> None:
        if self._pid == os.getpid():
            return
        # A forked child: its copy of the descriptor shares the parent's queue of
        # events; close the copy (the parent's stays open) and start afresh.
        self._slot = threading.Lock()
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._poller, self._finalizer = None, None, None
        self._pid = os.getpid()

    def _leave(self) -> None:
        self._slot.release()
        # close() may have come while this waiter held the slot, and failed to take it.
        if self._closed:
            self.close()

    def _arm(self) -> int | None:
        """The descriptor to wait on; -1 when the watch was set up just now (the caller
        returns, to look for what appeared before); None: sleep instead."""
        if self._stale:
            self._release()
        if self._fd is not None:
            return self._fd
        now = time.monotonic()
        if _INOTIFY is None or now < self._next_try:
            return None
        init1, add_watch = _INOTIFY
        fd = init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:  # EMFILE: the per-user limit of instances (fs.inotify.max_user_instances)
            self._next_try = now + _RETRY_SECONDS
            return None
        if add_watch(fd, os.fsencode(self.path), _MASK) < 0:
            # ENOENT (not made yet), ENOSPC (fs.inotify.max_user_watches), EACCES, ...
            os.close(fd)
            self._next_try = now + _RETRY_SECONDS
            return None
        self._fd, self._stale = fd, False
        self._finalizer = weakref.finalize(self, _close, fd, self._pid)
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        return -1

    def _drain(self, fd: int) -> bool:
        """Read every queued event; True if one says a file appeared (or events were
        lost, or the directory went)."""
        woken = False
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return woken
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self._stale = True
                return True
            offset = 0
            while offset + _EVENT.size <= len(data):
                _, mask, _, size = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size : offset + _EVENT.size + size].rstrip(b"\0")
                offset += _EVENT.size + size
                if mask & _GONE:
                    self._stale = True
                if mask & (_GONE | _IN_Q_OVERFLOW) or (name and not name.startswith(self._ignore)):
                    woken = True

    def _release(self) -> None:
        """Close this process's instance, if it has one; the slot is held."""
        fd, self._fd, self._poller = self._fd, None, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if fd is not None:
            os.close(fd)
