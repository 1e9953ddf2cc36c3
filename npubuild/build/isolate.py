"""Run native code that may crash on hostile input in a forked child, so a crash is one error for one task.

onnx's checker, shape inference and version converter are C++ reading whatever a
model file says: a Conv with `strides: [0, 0]` dies with SIGFPE inside
`infer_shapes`, which in-process would end the whole build (every other build of
a `--keep-going` night and its report.json). `run_isolated` forks, runs the
function in the child under a memory limit and returns its result; a child
killed by a signal, out of memory or over time becomes one `InputError` line
naming what it was doing. One fork per model import (~10 ms), never per node.

The child is a fork, not a fresh interpreter: the modules are already imported,
and it inherits the build-dir lock's fd like a doit worker (npubuild.build.lock
binds both to the parent's life).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from npubuild.errors import InputError, Location, NpubuildError

T = TypeVar("T")
DEFAULT_MEMORY_BYTES = 4 << 30  # address space the child may add to what it inherits
DEFAULT_TIMEOUT_S = 900.0


class ChildFailure(Exception):
    """A Python exception that is not an NpubuildError, raised in the child (a bug): its traceback kept."""

    def __init__(self, summary: str, child_traceback: str):
        super().__init__(summary)
        self.child_traceback = child_traceback


def _rebuild(kind: str, payload: dict) -> BaseException:
    if kind == "npubuild":
        loc = payload["location"]
        location = Location(*loc) if loc is not None else None
        cls = InputError if payload["exit_code"] == 2 else NpubuildError
        exc = cls(payload["message"], location)
        exc.exit_code = payload["exit_code"]
        return exc
    if kind == "memory":
        return InputError(f"{payload['what']} needs more than {payload['limit_mib']} MiB of memory",
                          payload["where"])
    return ChildFailure(payload["summary"], payload["traceback"])


def _child(fn: Callable[..., Any], args: tuple, write_fd: int, memory_bytes: int, what: str, where: str) -> None:
    """Runs in the child: never returns (os._exit), never runs the parent's atexit handlers or finalisers."""
    code = 0
    try:
        if faulthandler.is_enabled():  # its dump of a crash is many lines; the parent reports one
            faulthandler.disable()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        current = _address_space()
        if current is not None:
            limit = current + memory_bytes
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        try:
            result: tuple[str, Any] = ("ok", fn(*args))
        except NpubuildError as exc:
            loc = exc.location
            result = ("npubuild", {"message": exc.message, "exit_code": exc.exit_code,
                                   "location": (loc.file, loc.line, loc.col) if loc is not None else None})
        except MemoryError:
            result = ("memory", {"what": what, "limit_mib": memory_bytes >> 20, "where": where})
        except Exception as exc:  # a bug: the parent records it as an internal error with this traceback
            result = ("bug", {"summary": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        data = pickle.dumps(result)
        view = memoryview(data)
        while view:
            n = os.write(write_fd, view)
            view = view[n:]
    except BaseException:
        code = 70
    finally:
        os._exit(code)


def _address_space() -> int | None:
    """This process's virtual size in bytes (Linux), the base the child's memory limit is added to."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def run_isolated(fn: Callable[..., T], *args: Any, what: str, where: str, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> T:
    """`fn(*args)` in a forked child; its result, or its NpubuildError re-raised here. `what` says what the
    child does (for the one-line message when it crashes), `where` is the file it is about."""
    if not hasattr(os, "fork"):
        return fn(*args)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(fn, args, write_fd, memory_bytes, what, where)
    os.close(write_fd)
    try:
        data, status = _wait(pid, read_fd, timeout_s, what, where)
    finally:
        os.close(read_fd)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        raise InputError(f"{what} crashed on this model ({name}: {signal.strsignal(sig) or 'killed'})", where)
    if not data:
        raise InputError(f"{what} ended without a result (exit status {os.WEXITSTATUS(status)})", where)
    kind, payload = pickle.loads(data)
    if kind == "ok":
        return payload
    raise _rebuild(kind, payload)


def _wait(pid: int, read_fd: int, timeout_s: float, what: str, where: str) -> tuple[bytes, int]:
    """Read the child's result while waiting for it; kill it past the timeout (or if we are interrupted)."""
    import selectors

    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    sel = selectors.DefaultSelector()
    sel.register(read_fd, selectors.EVENT_READ)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise InputError(f"{what} did not finish in {timeout_s:.0f} s", where)
            if sel.select(min(left, 1.0)):
                chunk = os.read(read_fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        _, status = os.waitpid(pid, 0)
        return b"".join(chunks), status
    except BaseException:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        raise
    finally:
        sel.close()
