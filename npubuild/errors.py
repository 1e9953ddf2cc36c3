"""Error types that map to the CLI's exit codes.

`InputError` is anything the user can fix in their config, model or arguments
(exit 2); `StageError` is a stage that failed on valid input (exit 1); `InternalError`
is npubuild's own fault, an exception inside an import pass, a lowering or a check on
input it accepted (exit 1, kind `internal`, asking for a report). Each renders as one
line: `path:line:col: error: message` when a position is known. The kind is what
report.json's `error_kinds` lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Location:
    """A position in a source file, 1-based like editors show it."""

    file: str
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.col is not None:
                parts.append(str(self.col))
        return ":".join(parts)


class NpubuildError(Exception):
    """Base class: carries a one-line message and an optional location."""

    exit_code = 1
    detail: dict = {}  # what the failure measured, beside its line: kept in the stage's error.json for the report
    kind = "stage"

    def __init__(self, message: str, location: Location | str | Path | None = None):
        super().__init__(message)
        self.message = message
        if isinstance(location, (str, Path)):
            location = Location(str(location))
        self.location = location

    def __reduce__(self):  # pickled whole, whatever a subclass's __init__ takes (npubuild/fanout.py's workers)
        return (_unpickled, (type(self), self.args, self.__dict__))

    def __str__(self) -> str:
        prefix = f"{self.location}: " if self.location else ""
        return f"{prefix}error: {self.message}"


def plain_message(text: str) -> str:
    """An error's first line without its `error: ` tag (a position in front of it is kept):
    `error: target 'x': pool ...` -> `target 'x': pool ...`; `a.yaml:3:5: error: m` -> `a.yaml:3:5: m`."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else "failed"
    where, sep, rest = first.partition("error: ")
    return f"{where}{rest}" if sep else first


def _unpickled(cls: type[NpubuildError], args: tuple, state: dict) -> NpubuildError:
    exc = cls.__new__(cls)
    Exception.__init__(exc, *args)
    exc.__dict__.update(state)
    return exc


class InputError(NpubuildError):
    """Bad input: a config, a model or an argument the user must fix (exit 2)."""

    exit_code = 2
    kind = "input"


class UncomputedOutputError(InputError):
    """A graph output the lowered graph does not compute (a constant, an input, or fused away)."""

    def __init__(self, output_name: str):
        super().__init__(f"graph output '{output_name}' is not computed by the lowered graph (constant or input?)")
        self.output_name = output_name


class UnsupportedOpError(InputError):
    """An ONNX node the lowering cannot map; names the node and its op type."""

    def __init__(self, node_name: str, op_type: str, reason: str, location: Location | str | Path | None = None):
        super().__init__(f"node '{node_name}' ({op_type}): {reason}", location)
        self.node_name = node_name
        self.op_type = op_type
        self.reason = reason


class StageError(NpubuildError):
    """A stage failed on valid input (a tool error, a check that fell short): exit 1."""

    exit_code = 1


class PoolsTooSmall(StageError):
    """A pool check that failed (ethosu/pools.py): its one line, and per target every pool's need and size, so
    the report's fit table shows the builds that do not fit with what they need. `lower_bound`: the needs are
    the early check's lower bounds from the model's shapes (ethosu/early_fit.py), not Vela's exact sizes."""

    def __init__(self, message: str, pools: dict[str, list[dict]], lower_bound: bool = False):
        super().__init__(message)
        self.detail = {"pools": pools, "lower_bound": lower_bound}


REPORT_REQUEST = "please report it with the model if you can; --debug or the stage's error.json has the traceback"


class InternalError(NpubuildError):
    """An exception inside npubuild on input it accepted (a bug of ours, not the user's): exit 1, kind
    'internal'. `detail` keeps the traceback for the stage's error.json (`traceback`)."""

    exit_code = 1
    kind = "internal"

    def __init__(self, message: str, location: Location | str | Path | None = None, detail: str | None = None):
        super().__init__(f"internal error: {message} ({REPORT_REQUEST})", location)
        self.detail = {"traceback": detail} if detail else {}


def one_line(text: str, limit: int = 400) -> str:
    """`text` on one line, at most `limit` characters: a longer one loses its middle, never its end (where a
    tool's message says why: onnxruntime's 'This is an invalid model. ... Subgraph output (x) is an outer
    scope value being returned directly')."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    head = limit * 2 // 5
    tail = limit - head - 5
    return f"{flat[:head]} ... {flat[-tail:]}"


_NO_MEMORY_TEXT = ("Cannot allocate memory", "bad_alloc", "failed to map segment", "Failed to allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc`, or what caused it, is the process running out of memory rather than a fault of the
    input: a MemoryError, ENOMEM, or a native library saying so (onnxruntime's thread pool failing
    pthread_create, a C++ bad_alloc, a shared object that cannot be mapped under the stage's memory limit)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == 12):
            return True
        if any(text in str(exc) for text in _NO_MEMORY_TEXT):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


DISK_FULL_ERRNOS = frozenset({28, 122})  # ENOSPC, EDQUOT (a quota is a full disk to the writer)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or what caused it, is a write that found its filesystem full: ENOSPC or EDQUOT, or
    sqlite's 'database or disk is full'."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        if type(exc).__name__ == "OperationalError" and "disk is full" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


NEARLY_FULL_BYTES = 1 << 20


def nearly_full(path: str | Path) -> bool:
    """Whether the filesystem holding `path` has under NEARLY_FULL_BYTES left for this user: a stage that fails
    then most likely failed for it (a native library that writes a temp file ignores a short write and then
    fails to parse what it wrote: onnx's infer_shapes_path did)."""
    import os

    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < NEARLY_FULL_BYTES


def written_path(exc: BaseException) -> str | None:
    """The file a failed write was writing, where the error says (a copy's destination is its second name)."""
    if isinstance(exc, OSError):
        return exc.filename2 or exc.filename
    return None


def describe_disk(path: str | Path) -> str:
    """The filesystem holding `path`, as people find it: its mount point, size and free space (`/tmp/x (a
    1.0 MiB filesystem, 0 B free)`); the path itself where it cannot be found."""
    import os

    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    mount = p
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return str(mount)
    return f"{mount} (a {_size(st.f_blocks * st.f_frsize)} filesystem)"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class DiskFull(StageError):
    """A write that found its filesystem full: the disk and what could not be written, in one line. Neither the
    input's fault (exit 2) nor npubuild's (an internal error): exit 1, as a stage that failed."""

    def __init__(self, path: str | Path | None, what: str | None = None):
        target = str(path) if path is not None else None
        where = describe_disk(target) if target is not None else "a filesystem"
        text = f"no space left on device: {where} is full; could not write {what or target or 'a file'}"
        if what and target and target not in what:
            text += f" ({target})"
        super().__init__(text)
        self.path = target
