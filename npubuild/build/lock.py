"""One build at a time per build dir: an exclusive flock on <build-dir>/.lock.

The kernel drops the lock when the holder dies (even by SIGKILL), so a crashed
build never leaves the directory locked. A second build either waits for the
lock or stops at once with one line naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from npubuild.errors import InputError

LOCK_NAME = ".lock"


class BuildDirBusy(InputError):
    """Another process holds the build dir (exit 2: run it later, add --wait, or use another --build-dir)."""


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 200).decode(errors="replace").strip()
    except OSError:
        text = ""
    return f" (pid {text})" if text.isdigit() else ""


def acquire(build_dir: Path, wait: bool = False, poll_s: float = 0.2) -> int:
    """Take the lock; returns the open fd that holds it (close it to release)."""
    build_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(build_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
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
            time.sleep(poll_s)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


@contextlib.contextmanager
def locked(build_dir: Path, wait: bool = False) -> Iterator[None]:
    fd = acquire(build_dir, wait)
    try:
        yield
    finally:
        os.close(fd)
