"""Run native code that may crash on hostile input in a forked child, so a crash is one error for one task.

onnx's checker and shape inference, onnxruntime, the TOSA reference model and
Vela are C++ reading whatever a model says: a Conv with `strides: [0, 0]` dies
with SIGFPE inside `infer_shapes`, which in-process would end the whole build
(every other build of a `--keep-going` night and its report.json).
`run_isolated` forks, runs the function in the child under a memory limit and
returns its result; a child killed by a signal, out of memory or over time
becomes one error line naming what it was doing. execute.py runs every stage
task this way (one fork per task, ~20 ms; never one per node).

The child is a fork, not a fresh interpreter: the modules are already imported,
and it inherits the build-dir lock's fd like a doit worker (npubuild.engine.lock
binds both to the parent's life). Forking is only safe from a process whose
only thread is the one forking: a caller off the main thread (a Dask worker
runs tasks in a thread pool beside its event loop) gets its child from a
forkserver instead, a single-threaded server started once per process with
the stage modules preloaded, so the child is as cheap and as isolated.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import multiprocessing.util
import os
import pickle
import resource
import selectors
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from npubuild.errors import (
    DiskFull,
    InputError,
    Location,
    NpubuildError,
    is_disk_full,
    is_out_of_memory,
    written_path,
)
from npubuild.machine import MEMORY_ENV, memory_limit_bytes

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 3600.0
PRELOAD = ("__main__", "numpy", "onnx", "onnxruntime")  # the caller's main module (else each child imports it)


class ChildFailure(Exception):
    """A Python exception that is not an NpubuildError, raised in the child (a bug): its traceback kept."""

    def __init__(self, summary: str, child_traceback: str):
        super().__init__(summary)
        self.child_traceback = child_traceback


def isolation_possible() -> bool:
    """Whether this process may start a child for a task: it can fork (POSIX) and is not a daemonic
    multiprocessing child (those may not have children)."""
    return hasattr(os, "fork") and not multiprocessing.current_process().daemon


def _pickled(exc: NpubuildError) -> bytes | None:
    try:
        return pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - an attribute that will not pickle: the parent rebuilds it from the fields
        return None


def _rebuild(kind: str, payload: dict, failure: type[NpubuildError], where: str | None) -> BaseException:
    if kind == "npubuild" and payload.get("error") is not None:
        return pickle.loads(payload["error"])
    if kind == "npubuild":
        loc = payload["location"]
        exc = (InputError if payload["exit_code"] == 2 else NpubuildError)(
            payload["message"], Location(*loc) if loc is not None else None)
        exc.exit_code = payload["exit_code"]
        exc.detail = payload.get("detail") or {}
        return exc
    if kind == "disk":
        return DiskFull(payload["path"])
    if kind == "memory":
        return failure(f"{payload['what']} needs more than {payload['limit_mib']} MiB of memory "
                       f"(${MEMORY_ENV} raises the limit)", where)
    return ChildFailure(payload["summary"], payload["traceback"])


def _address_space() -> int | None:
    """This process's virtual size in bytes (Linux), the base the child's memory limit is added to."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


NEAR_LIMIT_BYTES = 64 << 20


def _near(limit: int | None) -> bool:
    """Whether this process is within NEAR_LIMIT_BYTES of its address-space limit: an unexpected error then
    is an allocation that failed and was reported as something else (protobuf's 'Failed to serialize
    proto'), not a bug."""
    current = _address_space()
    return limit is not None and current is not None and limit - current < NEAR_LIMIT_BYTES


def _outcome(fn: Callable[..., Any], args: tuple, memory_bytes: int, what: str) -> bytes:
    """In the child: run `fn` under the memory limit; its result or error, pickled for the parent."""
    if faulthandler.is_enabled():  # its dump of a crash is many lines; the parent reports one
        faulthandler.disable()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    current = _address_space()
    limit = None
    if current is not None:
        limit = current + memory_bytes if hard == resource.RLIM_INFINITY else min(current + memory_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        result: tuple[str, Any] = ("ok", fn(*args))
    except NpubuildError as exc:
        loc = exc.location
        result = ("npubuild", {"message": exc.message, "exit_code": exc.exit_code,
                               "location": (loc.file, loc.line, loc.col) if loc is not None else None,
                               "error": _pickled(exc)})  # whole: its class (InternalError...) and detail
    except Exception as exc:  # a bug (the parent records it as an internal error with this traceback), or
        if is_disk_full(exc):  # a full disk: said as such by the parent, naming it and the file
            result = ("disk", {"path": written_path(exc)})
        elif is_out_of_memory(exc) or _near(limit):  # the limit: a MemoryError, ENOMEM, an unmappable library,
            result = ("memory", {"what": what, "limit_mib": memory_bytes >> 20})  # or a library's own error
        else:
            result = ("bug", {"summary": f"{type(exc).__name__}: {exc}",
                              "traceback": traceback.format_exc()})
    return pickle.dumps(result)


def _child(fn: Callable[..., Any], args: tuple, write_fd: int, memory_bytes: int, what: str) -> None:
    """Runs in a forked child: never returns (os._exit), never runs the parent's atexit handlers or finalisers."""
    code = 0
    try:
        view = memoryview(_outcome(fn, args, memory_bytes, what))
        while view:
            view = view[os.write(write_fd, view):]
    except BaseException:  # noqa: BLE001 - interrupted, or the result would not pickle: no result
        code = 70
    finally:
        os._exit(code)


def _served_child(fn: Callable[..., Any], args: tuple, conn, memory_bytes: int, what: str,
                  prepare: Callable[[], Any] | None) -> None:
    """Runs in a child of the forkserver: dies with the server (which dies with the process that asked)."""
    from npubuild.engine.lock import die_with_parent

    die_with_parent()
    code = 0
    try:
        if prepare is not None:
            prepare()
        conn.send_bytes(_outcome(fn, args, memory_bytes, what))
    except BaseException:  # noqa: BLE001 - as in _child
        code = 70
    finally:
        conn.close()
        os._exit(code)


def _result_or_failure(status_signal: int | None, exit_code: int, data: bytes, what: str, where: str | None,
                failure: type[NpubuildError], timeout_s: float, timed_out: bool, memory_bytes: int) -> Any:
    """The child's result, or the one-line error its end becomes."""
    if timed_out:
        raise failure(f"{what} did not finish in {timeout_s:.0f} s", where)
    if status_signal is not None:
        try:
            name = signal.Signals(status_signal).name
        except ValueError:
            name = f"signal {status_signal}"
        # native code (onnxruntime, the reference model) aborts when an allocation fails: under the limit that is
        # as likely as a bug, and the user can tell by raising it
        hint = (f"; a native allocation that fails under the {memory_bytes >> 20} MiB stage memory limit "
                f"(${MEMORY_ENV}) ends so too" if status_signal == signal.SIGABRT else "")
        raise failure(f"{what} crashed on this model ({name}: {signal.strsignal(status_signal) or 'killed'}{hint})",
                      where)
    if not data:  # the child could not even report: under a tight limit, most often its memory
        raise failure(f"{what} ended without a result (exit status {exit_code}); under the {memory_bytes >> 20} MiB "
                      f"stage memory limit that is most often memory (${MEMORY_ENV} raises the limit)", where)
    return pickle.loads(data)


def run_isolated(fn: Callable[..., T], *args: Any, what: str, where: str | None = None,
                 failure: type[NpubuildError] = InputError, memory_bytes: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, prepare: Callable[[], Any] | None = None,
                 preload: tuple[str, ...] = ()) -> T:
    """`fn(*args)` in a forked child; its result, or its NpubuildError re-raised here. `what` says what the
    child does and `where` the file it is about, for the one line a crash, the memory limit or the timeout
    become, as a `failure` (InputError: the model is at fault; StageError: a tool is). Off the main thread
    `fn` and `args` must pickle (a module-level function): the child comes from the forkserver. `prepare`
    (imports, say) runs outside the memory limit: in this process before a fork, so that every child shares
    it, or in the forkserver's child before its limit is set. `preload`: modules the forkserver imports when
    it starts (the first call off the main thread starts it), so that its children do not import them."""
    memory_bytes = memory_limit_bytes() if memory_bytes is None else memory_bytes
    if threading.current_thread() is threading.main_thread():
        if prepare is not None:
            prepare()
        kind, payload = _forked(fn, args, memory_bytes, what, where, failure, timeout_s)
    else:
        kind, payload = _from_forkserver(fn, args, memory_bytes, what, where, failure, timeout_s, prepare, preload)
    if kind == "ok":
        return payload
    raise _rebuild(kind, payload, failure, where)


def _forked(fn: Callable[..., Any], args: tuple, memory_bytes: int, what: str, where: str | None,
            failure: type[NpubuildError], timeout_s: float) -> tuple[str, Any]:
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(fn, args, write_fd, memory_bytes, what)
    os.close(write_fd)
    try:
        data, status = _wait(pid, read_fd, timeout_s)
    finally:
        os.close(read_fd)
    if status is None:
        return _result_or_failure(None, 0, b"", what, where, failure, timeout_s, timed_out=True,
                                  memory_bytes=memory_bytes)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0
    return _result_or_failure(sig, code, data, what, where, failure, timeout_s, timed_out=False,
                              memory_bytes=memory_bytes)


_SERVER_LOCK = threading.Lock()
_server_context: multiprocessing.context.BaseContext | None = None
# a socket path's limit (sockaddr_un.sun_path less its NUL; 104 on macOS, 108 on Linux) and what
# multiprocessing's forkserver adds to its temp dir for its socket: /pymp-XXXXXXXX/listener-XXXXXXXX
SOCKET_PATH_MAX = 103
FORKSERVER_SOCKET_SUFFIX = len("/pymp-XXXXXXXX/listener-XXXXXXXX")
SHORT_TEMP_DIRS = ("/tmp", "/var/tmp", "/usr/tmp")


def short_socket_dir(base: str | None = None) -> str | None:
    """Give multiprocessing a temp dir short enough for the forkserver's AF_UNIX socket, where TMPDIR's is not;
    the dir made, or None where TMPDIR's serves (or one was set already).

    Python 3.11's forkserver binds its socket at <TMPDIR>/pymp-*/listener-*: a deep TMPDIR (a Dask worker run
    in its own directory, as tests/engine/test_dask_share_nothing.py runs them) failed every stage with
    `OSError: AF_UNIX path too long`. Python 3.13 falls back to a short system temp dir there; this does the
    same, once, before the server starts (its address is made in this process, under this temp dir)."""
    config = multiprocessing.current_process()._config  # multiprocessing's own record of its temp dir
    if config.get("tempdir") is not None:
        return None
    base = base if base is not None else tempfile.gettempdir()
    if len(base) + FORKSERVER_SOCKET_SUFFIX <= SOCKET_PATH_MAX:
        return None
    for short in SHORT_TEMP_DIRS:
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK):
            made = tempfile.mkdtemp(prefix="pymp-", dir=short)
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(made,), kwargs={"ignore_errors": True},
                                          exitpriority=-100)
            config["tempdir"] = made
            return made
    return None


def _forkserver(preload: tuple[str, ...]) -> multiprocessing.context.BaseContext:
    """This process's forkserver context. The server starts once per process, with PRELOAD and the first
    caller's `preload` imported, so that its children (forks of it) find them loaded."""
    global _server_context
    with _SERVER_LOCK:
        if _server_context is None:
            short_socket_dir()
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload([*PRELOAD, *preload])
            _server_context = ctx
        return _server_context


def _from_forkserver(fn: Callable[..., Any], args: tuple, memory_bytes: int, what: str, where: str | None,
                     failure: type[NpubuildError], timeout_s: float, prepare: Callable[[], Any] | None,
                     preload: tuple[str, ...]) -> tuple[str, Any]:
    ctx = _forkserver(preload)
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_served_child, args=(fn, args, send, memory_bytes, what, prepare), daemon=True)
    try:
        proc.start()
        send.close()
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        timed_out = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            if recv.poll(min(left, 1.0)):
                try:
                    chunks.append(recv.recv_bytes())
                except EOFError:
                    pass
                break
            if not proc.is_alive() and not recv.poll(0):
                break
        if timed_out:
            proc.kill()
        proc.join()
    except BaseException:
        if proc.is_alive():
            proc.kill()
            proc.join()
        raise
    finally:
        recv.close()
    code = proc.exitcode or 0
    sig = -code if code < 0 else None
    return _result_or_failure(sig, max(code, 0), b"".join(chunks), what, where, failure, timeout_s, timed_out,
                              memory_bytes=memory_bytes)


def _wait(pid: int, read_fd: int, timeout_s: float) -> tuple[bytes, int | None]:
    """The child's result and exit status (None: killed past the timeout). The child is killed if we are
    interrupted (Ctrl-C) while waiting."""
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
                return b"", None
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
