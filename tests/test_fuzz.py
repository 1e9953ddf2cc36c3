"""Seeded fuzzing of the two untrusted inputs, a compile spec and an ONNX model (tests/fuzz_inputs.py).

Every outcome must be success or bad input: exit 2 with at most two lines on stderr, no traceback, no hang,
and no process over 1 GiB of RSS for these models (each a few KiB). 300 spec mutations go through
`validate`, 160 model mutations through the import stage's own isolated child, and the first few that import
through a whole `compile` in a separate process (its exit code, stderr and peak RSS: getrusage of children).
"""

from __future__ import annotations

import contextlib
import io
import random
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from npbtest.fuzz_inputs import base_model, mutate_model, mutate_spec

from npubuild.cli import main
from npubuild.engine.isolate import run_isolated
from npubuild.errors import InputError
from npubuild.frontend.normalise import import_model

SEED = 20261201
MAX_RSS_KIB = 1 << 20  # 1 GiB
CASE_TIMEOUT_S = 30


def _violation(code, err: str) -> str | None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if code == 0:
        return None
    if code != 2:
        return f"exit {code}"
    if len(lines) > 2:
        return f"{len(lines)} lines"
    if "Traceback" in err:
        return "traceback"
    return None


@contextlib.contextmanager
def _deadline(seconds: int):
    def fire(signum, frame):
        raise TimeoutError(f"no result in {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def fuzz_project(tmp_path: Path) -> Path:
    root = tmp_path / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    (root / "configs" / "models" / "m.onnx").write_bytes(base_model().SerializeToString())
    return root


def test_fuzzed_specs_are_valid_or_one_line_exit_2(fuzz_project: Path, monkeypatch):
    rng = random.Random(SEED)
    monkeypatch.chdir(fuzz_project)
    spec = fuzz_project / "configs" / "fuzz.yaml"
    failures, codes = [], {0: 0, 2: 0}
    for i in range(300):
        text = mutate_spec(rng)
        spec.write_text(text, encoding="utf-8", errors="surrogatepass")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _deadline(CASE_TIMEOUT_S):
            try:
                code = main(["validate", str(spec)])
            except BaseException as exc:  # noqa: BLE001 - anything escaping main is a finding
                code = f"{type(exc).__name__}: {exc}"
        problem = _violation(code, err.getvalue())
        if problem:
            failures.append(f"case {i}: {problem}: {text[:200]!r} -> {err.getvalue()[-300:]!r}")
        else:
            codes[code] += 1
    assert not failures, "\n".join(failures[:5])
    assert codes[0] > 0 and codes[2] > 100  # the mutations reach both outcomes


def test_fuzzed_models_import_or_fail_with_one_line_and_small_memory(tmp_path: Path):
    rng = random.Random(SEED)
    failures, imported = [], []
    for i in range(160):
        model = tmp_path / f"m{i}.onnx"
        model.write_bytes(mutate_model(rng))
        try:
            run_isolated(import_model, model, {}, tmp_path / f"out{i}.onnx", what="ONNX import", where=str(model),
                         timeout_s=CASE_TIMEOUT_S)
            imported.append(model)
        except InputError as exc:
            text = str(exc)
            if "\n" in text or "did not finish" in text:
                failures.append(f"{model.name}: {text[:300]}")
        except Exception as exc:  # noqa: BLE001 - anything but InputError is a finding
            failures.append(f"{model.name}: {type(exc).__name__}: {str(exc)[:300]}")
    assert not failures, "\n".join(failures[:5])
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < MAX_RSS_KIB
    assert 0 < len(imported) < 160

    for model in imported[:3]:  # the rest of the build on what got past import, in its own process
        proc = subprocess.Popen([sys.executable, "-m", "npubuild", "compile", str(model), "--target", "ethos-u85-256",
                                 "--build-dir", str(tmp_path / f"b-{model.stem}"), "--json"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError(f"{model.name}: compile did not finish in 300 s") from None
        assert _violation(proc.returncode, err) is None, f"{model.name}: exit {proc.returncode}: {err[-500:]}"
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child waited for
    assert children < MAX_RSS_KIB, f"a child used {children // 1024} MiB"
