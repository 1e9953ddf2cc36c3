"""One build at a time per build dir: an exclusive flock on <build-dir>/.lock.

The kernel drops the lock when the last process holding its file description
dies (even by SIGKILL), so a crashed build never leaves the directory locked.
Every process forked by the holder (doit's `-n` workers, an isolated import)
inherits that description, so the lock is bound to the whole process tree:
each such child is set to die with its parent (Linux PR_SET_PDEATHSIG, else a
watchdog thread), and SIGKILL of the main pid frees the build dir instead of
leaving idle workers holding it under a dead pid. A second build either waits
for the lock or stops at once with one line naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from npubuild.errors import DiskFull, InputError, is_disk_full

LOCK_NAME = ".lock"
PR_SET_PDEATHSIG = 1
_held: set[int] = set()  # fds of build-dir locks this process holds (forked children inherit them)
_hook_installed = False


@functools.lru_cache(maxsize=1)
def _libc():
    """libc for prctl, loaded once per process (forked children inherit it: find_library runs ldconfig)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _die_with_parent(parent: int) -> None:
    """In a forked child of a lock holder: end when the parent ends, so no orphan keeps the lock."""
    if sys.platform.startswith("linux"):
        try:
            libc = _libc()
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent died before prctl took effect
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="npubuild-lock-watchdog", daemon=True).start()


def die_with_parent() -> None:
    """End this process when its parent ends (an isolated stage's child of a forkserver)."""
    _die_with_parent(os.getppid())


def _after_fork_in_child(parent: int) -> None:
    if _held:
        _die_with_parent(parent)


def _install_fork_hook() -> None:
    global _hook_installed
    if not _hook_installed:
        parent = [os.getpid()]
        os.register_at_fork(before=lambda: parent.__setitem__(0, os.getpid()),
                            after_in_child=lambda: _after_fork_in_child(parent[0]))
        _hook_installed = True


class BuildDirBusy(InputError):
    """Another process holds the build dir (exit 2: run it later, add --wait, or use another --build-dir)."""


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 200).decode(errors="replace").strip()
    except OSError:
        text = ""
    if not text.isdigit():
        return ""
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return f" (pid {text}, no longer running: processes it started still hold the lock)"
    except (PermissionError, OverflowError):
        pass
    return f" (pid {text})"


def _open_lock_file(build_dir: Path) -> int:
    """Create the build dir and open its lock file; an unusable path is one line (exit 2), not a traceback."""
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError("cannot use as a build dir: it is a file", str(build_dir)) from None
    except NotADirectoryError:
        raise InputError("cannot use as a build dir: a directory above it is a file", str(build_dir)) from None
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(build_dir, "the build dir") from None
        raise InputError(f"cannot use as a build dir: {exc.strerror or exc}", str(build_dir)) from None
    path = build_dir / LOCK_NAME
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except IsADirectoryError:
        raise InputError("is a directory, not npubuild's lock file: remove it", str(path)) from None
    except OSError as exc:
        if is_disk_full(exc):
            raise DiskFull(path, "the build dir's lock file") from None
        raise InputError(f"cannot open the build dir's lock file: {exc.strerror or exc}", str(path)) from None


def acquire(build_dir: Path, wait: bool = False, poll_s: float = 0.2) -> int:
    """Take the lock; returns the open fd that holds it (close it with `release`). `wait`: block until the
    holder is done, saying so once on stderr (as cargo does: a silent wait looks like a hang)."""
    fd = _open_lock_file(build_dir)
    said = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if not wait:
                holder = _holder(fd)
                os.close(fd)
                raise BuildDirBusy(f"build dir is in use by another npubuild build{holder}; "
                                   "wait for it, pass --wait, or use another --build-dir", str(build_dir)) from None
            if not said:
                sys.stderr.write(f"{build_dir}: waiting for another npubuild build{_holder(fd)} to finish\n")
                sys.stderr.flush()
                said = True
            time.sleep(poll_s)
        except OSError as exc:  # e.g. ENOLCK: a file system without locks
            os.close(fd)
            raise InputError(f"cannot lock the build dir: {exc.strerror or exc}", str(build_dir)) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except OSError as exc:
        os.close(fd)
        if is_disk_full(exc):
            raise DiskFull(build_dir / LOCK_NAME, "the build dir's lock file") from None
        raise InputError(f"cannot write the build dir's lock file: {exc.strerror or exc}", str(build_dir)) from None
    _install_fork_hook()
    if sys.platform.startswith("linux"):
        try:
            _libc()  # loaded here, not in every forked child
        except OSError:
            pass
    _held.add(fd)
    return fd


def release(fd: int) -> None:
    _held.discard(fd)
    os.close(fd)


@contextlib.contextmanager
def locked(build_dir: Path, wait: bool = False) -> Iterator[None]:
    fd = acquire(build_dir, wait)
    try:
        yield
    finally:
        release(fd)
