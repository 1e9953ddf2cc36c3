"""Bench-only: the CPU seconds a process spends running models, for bench/compile_real.py --clock-runs.

Put this directory on PYTHONPATH with NPUBUILD_RUNCLOCK=<log file>: every Python process of the build (workers
and Vela's children included) then wraps, when each is first imported, onnxruntime's `InferenceSession.run` and
the TOSA reference model's `run` (and npu-sim's `simulate_build`, the stage's whole run of the deployable on the
virtual device, whose reference-model runs then count as its own; and each Vela compile, in the fork that runs
it, under "vela": compile work, not a run), and appends one line per outermost run to the log:
`<kind> <stage> <process CPU s>`. Process CPU time (all threads) is taken over the union of the intervals in
which some run is active, so onnxruntime's own worker threads count and overlapping runs count once. The stage
is the npubuild/stages/<name>.py module on the caller's stack ("other" if none). Not part of npubuild.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
import time

_LOG = os.environ.get("NPUBUILD_RUNCLOCK")
_lock = threading.Lock()
_active = 0
_start = 0.0
_fd: int | None = None
_fd_pid = 0


def _stage() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        at = name.rfind("/npubuild/stages/")
        if at >= 0:
            return name[at + len("/npubuild/stages/"):].removesuffix(".py")
        frame = frame.f_back
    return "other"


def _write(line: str) -> None:
    global _fd, _fd_pid
    if _fd is None or _fd_pid != os.getpid():  # a forked child opens its own descriptor
        _fd, _fd_pid = os.open(_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), os.getpid()
    os.write(_fd, line.encode())


def _clocked(kind: str, fn):
    def run(*args, **kwargs):
        global _active, _start
        stage = _stage()
        with _lock:
            if _active == 0:
                _start = time.process_time()
            _active += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with _lock:
                _active -= 1
                spent = time.process_time() - _start if _active == 0 else None
            if spent is not None:
                _write(f"{kind} {stage} {spent:.6f}\n")
    return run


def _patch(module) -> None:
    if module.__name__ == "onnxruntime":
        cls = module.InferenceSession
        cls.run = _clocked("onnxruntime", cls.run)
    elif module.__name__ == "tosa_reference_model":
        module.run = _clocked("reference-model", module.run)
    elif module.__name__ == "npubuild.ethosu.vela":  # each Vela compile, in the forked child that runs it
        module._vela_child = _clocked("vela", module._vela_child)
    elif module.__name__ == "npubuild.verify.npu_sim":  # its runs inside count as the simulator's, once
        module.simulate_build = _clocked("npu-sim", module.simulate_build)


_PATCHED = ("onnxruntime", "tosa_reference_model", "npubuild.ethosu.vela", "npubuild.verify.npu_sim")


class _Finder(importlib.abc.MetaPathFinder):
    """Lets the two modules import as usual, then patches them once loaded."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)
        spec.loader.exec_module = exec_and_patch
        return spec


if _LOG:
    sys.meta_path.insert(0, _Finder())
