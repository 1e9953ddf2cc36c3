"""Seeded fuzzing of the two untrusted inputs, a compile spec and an ONNX model (tests/fuzz_inputs.py).

Every outcome must be success or bad input: exit 2 with at most two lines on stderr, no traceback, no hang,
and no process over 1 GiB of RSS for these models (each a few KiB). 300 spec mutations go through
`validate`, 160 model mutations through the import stage's own isolated child, and the first few that import
through a whole `compile` in a separate process (its exit code, stderr and peak RSS: getrusage of children).

Issue 34's cases, seeded too: spec bytes that are not UTF-8 (each at its line:col), model strings that are
not UTF-8, baselines with metrics that are not finite numbers, hostile flags and settings (-n, the stage
workers and memory, cache URLs and key files, --samples, --target, --junit), runs stopped by failures while
models are edited in place (never a stale `passed`), planted cache files (never restored beside checks of
the genuine ones), and build dirs on filesystems of random small sizes (root: a tmpfs each).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from npbtest.builds import flip_weight_signs, tiny_project
from npbtest.fuzz_inputs import (
    base_model,
    hostile_flags,
    mutate_model,
    mutate_model_strings,
    mutate_report,
    mutate_spec,
    mutate_spec_bytes,
)

from npubuild.cli import main
from npubuild.config.load import load_specs
from npubuild.engine.isolate import run_isolated
from npubuild.engine.plan import make_plan
from npubuild.errors import InputError
from npubuild.frontend.normalise import import_model
from npubuild.stages import STAGES

SEED = 20261201
MAX_RSS_KIB = 1 << 20  # 1 GiB
# a whole compile's largest process (stage children forked from one with onnxruntime, Vela and TFLite Micro loaded):
# measured 1.03-1.06 GiB on a clean-clone CI for the small models that pass import; a memory bomb is far past this
MAX_COMPILE_RSS_KIB = 3 << 19  # 1.5 GiB
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


def fuzz_imports_and_compiles(work: Path) -> dict:
    """The model mutations through the import stage's isolated child, then a whole `compile` of the first few that
    import, each in its own process: what failed, how many imported, and the largest child's peak RSS (KiB) after
    the imports and after the compiles. The test runs this in a fresh interpreter: getrusage of children covers a
    process's whole life, and an xdist worker's earlier test files' children (and forks of the worker they grew:
    a fork's RSS starts at its parent's) would count as this test's."""
    rng = random.Random(SEED)
    failures, imported = [], []
    for i in range(160):
        model = work / f"m{i}.onnx"
        model.write_bytes(mutate_model(rng))
        try:
            run_isolated(import_model, model, {}, work / f"out{i}.onnx", what="ONNX import", where=str(model),
                         timeout_s=CASE_TIMEOUT_S)
            imported.append(model)
        except InputError as exc:
            text = str(exc)
            if "\n" in text or "did not finish" in text:
                failures.append(f"{model.name}: {text[:300]}")
        except Exception as exc:  # noqa: BLE001 - anything but InputError is a finding
            failures.append(f"{model.name}: {type(exc).__name__}: {str(exc)[:300]}")
    import_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    for model in imported[:3]:  # the rest of the build on what got past import, in its own process
        proc = subprocess.Popen([sys.executable, "-m", "npubuild", "compile", str(model), "--target", "ethos-u85-256",
                                 "--build-dir", str(work / f"b-{model.stem}"), "--json"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failures.append(f"{model.name}: compile did not finish in 300 s")
            continue
        if _violation(proc.returncode, err) is not None:
            failures.append(f"{model.name}: compile exit {proc.returncode}: {err[-500:]}")
    return {"failures": failures, "imported": len(imported), "import_rss_kib": import_rss,
            "compile_rss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}


def test_fuzzed_models_import_or_fail_with_one_line_and_small_memory(tmp_path: Path):
    code = ("import json, sys, pathlib, test_fuzz; "
            "print(json.dumps(test_fuzz.fuzz_imports_and_compiles(pathlib.Path(sys.argv[1]))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *filter(None, sys.path)])}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not got["failures"], "\n".join(got["failures"][:5])
    assert got["import_rss_kib"] < MAX_RSS_KIB, f"an import child used {got['import_rss_kib'] // 1024} MiB"
    assert 0 < got["imported"] < 160
    assert got["compile_rss_kib"] < MAX_COMPILE_RSS_KIB, f"a child used {got['compile_rss_kib'] // 1024} MiB"


# ------------------------------------------------------------------ issue 34: the cases a hardening round found

def test_fuzzed_spec_bytes_that_are_not_utf8_are_one_line_at_their_position(fuzz_project: Path, capsys):
    rng = random.Random(SEED + 34)
    spec = fuzz_project / "configs" / "fuzz.yaml"
    for _ in range(60):
        data, line, col = mutate_spec_bytes(rng)
        spec.write_bytes(data)
        code = main(["validate", str(spec)])
        err = capsys.readouterr().err
        assert code == 2 and _violation(code, err) is None, err
        assert err.startswith(f"{spec}:{line}:{col}: error: invalid YAML: byte 0x"), (data, err)


def test_fuzzed_model_strings_that_are_not_utf8_are_bad_input(tmp_path: Path):
    rng = random.Random(SEED + 35)
    for i in range(40):
        data, target = mutate_model_strings(rng)
        model = tmp_path / f"s{i}.onnx"
        model.write_bytes(data)
        with pytest.raises(InputError) as caught:
            run_isolated(import_model, model, {}, tmp_path / f"o{i}.onnx", what="ONNX import", where=str(model),
                         timeout_s=CASE_TIMEOUT_S)
        assert "\n" not in str(caught.value), (target, str(caught.value))


def test_fuzzed_baselines_never_switch_the_comparison_off(fuzz_project: Path, capsys, monkeypatch):
    from npbtest.fuzz_inputs import SPEC

    (fuzz_project / "configs" / "fuzz.yaml").write_text(SPEC)
    monkeypatch.chdir(fuzz_project)
    assert main(["build", "-q", "--cache", "off"]) == 0
    report = json.loads((fuzz_project / "build" / "report.json").read_text())
    capsys.readouterr()
    rng = random.Random(SEED + 36)
    baseline = fuzz_project / "baseline.json"
    for _ in range(24):
        text, refused = mutate_report(rng, report)
        baseline.write_text(text)
        code = main(["report", "--baseline", str(baseline)])
        out, err = capsys.readouterr()
        if refused:
            assert code == 2 and _violation(code, err) is None and "not a finite number" in err, (text[:200], err)
        else:
            assert code in (0, 1) and "Traceback" not in err and "Against the baseline" in out


def test_fuzzed_flags_and_settings_are_bounded_or_one_line(fuzz_project: Path, capsys, monkeypatch):
    from npbtest.fuzz_inputs import SPEC

    (fuzz_project / "configs" / "fuzz.yaml").write_text(SPEC)
    monkeypatch.chdir(fuzz_project)
    for name in [k for k in os.environ if k.startswith("NPUBUILD_")]:
        monkeypatch.delenv(name)
    assert main(["build", "-q", "--cache", "off"]) == 0  # everything after this is up to date: only flags run
    capsys.readouterr()
    rng = random.Random(SEED + 37)
    for _ in range(30):
        args, env, expected = hostile_flags(rng)
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            with _deadline(CASE_TIMEOUT_S * 4):
                code = main(args)
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert "Traceback" not in err and "internal error" not in err, (args, env, err)
        if expected == "bad":
            assert code == 2 and len(lines) == 1, (args, env, code, err)
        else:
            assert code == 0 and len(lines) <= 1 and all(ln.startswith("note: -n ") for ln in lines), (args, err)
            assert json.loads((fuzz_project / "build" / "run.json").read_text())["jobs"] <= os.cpu_count()


def test_fuzzed_stops_and_edits_never_report_a_stale_build(tmp_path: Path, capsys):
    """Rounds of: some specs made to fail (their model replaced by one that is not ONNX), some models edited in
    place, with or without --keep-going. Whatever stops the run, a build reported passed is of the model file
    as it is now, and a build not finished carries no figure of an earlier run."""
    root = tmp_path / "p"
    models = tiny_project(root, 3)
    (root / "configs" / "models" / "broken.onnx").write_bytes(b"not an ONNX model")
    rng = random.Random(SEED + 38)
    build = ["build", "-q", "--cache", "off", "--build-dir", str(root / "build")]
    stopped_before_an_edit = 0  # rounds that stop at a failure before a build whose model was edited
    for round_ in range(5):
        # round 0 builds everything: the later rounds have earlier runs' records to be tempted by
        failing = {i for i in range(3) if rng.random() < 0.25} or {rng.choice([0, 1])} if round_ else set()
        edited = {i for i in range(3) if round_ and i not in failing and rng.random() < 0.7}
        for i, model in enumerate(models):
            spec = root / "configs" / f"s{i}.yaml"
            text = re.sub(r"path: models/\S+", f"path: models/{'broken' if i in failing else model.stem}.onnx",
                          spec.read_text())
            spec.write_text(text)
            if i in edited:
                flip_weight_signs(model, rng.randrange(1 << 30))
        keep_going = rng.random() < 0.3
        stopped_before_an_edit += not keep_going and any(f < e for f in failing for e in edited - failing)
        old = os.getcwd()
        os.chdir(root)
        try:
            main(build + (["--keep-going"] if keep_going else []))
        finally:
            os.chdir(old)
        capsys.readouterr()
        report = json.loads((root / "build" / "report.json").read_text())
        for b in report["builds"]:
            now = hashlib.sha256((root / "configs" / "models" / f"m{b['spec'][1:]}.onnx").read_bytes()).hexdigest()
            if b["status"] == "passed":
                assert b["inputs"]["model_sha256"] == now, (round_, b["spec"])
            if b["status"] == "skipped":
                assert b["inputs"]["model_sha256"] in (None, now) and b["metrics"].get("tosa_snr_db") is None, b
    assert stopped_before_an_edit, "the seed never made the case this test is for: change it"


def test_fuzzed_planted_cache_files_are_never_restored_under_clean_checks(tmp_path: Path, capsys):
    """An unkeyed local cache whose entry files are replaced (with their manifest's sha256 and size) by anyone
    who can write there: a stage restored from such an entry is the planted content, and no stage that reads
    its files may be restored from the entries made from the genuine ones."""
    root = tmp_path / "p"
    tiny_project(root, 1)
    cache = tmp_path / "cache"
    old = os.getcwd()
    os.chdir(root)
    try:
        assert main(["build", "-q", "--cache", str(cache), "--build-dir", str(root / "b0")]) == 0
        rng = random.Random(SEED + 39)
        # the entries with files to plant (a stage with metrics alone, early-fit, keeps none); their keys, so the
        # seeded choice, change with the code's fingerprints
        manifests = sorted(m for m in cache.glob("*/*/manifest.json") if json.loads(m.read_text())["files"])
        for round_ in range(3):
            manifest_path = rng.choice(manifests)
            manifest = json.loads(manifest_path.read_text())
            name = rng.choice(sorted(manifest["files"]))
            info = manifest["files"][name]
            f = manifest_path.parent / info["path"]
            data = bytearray(f.read_bytes())
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            f.write_bytes(bytes(data))
            info.update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
            manifest_path.write_text(json.dumps(manifest))
            build_dir = root / f"b{round_ + 1}"
            main(["build", "-q", "--keep-going", "--cache", str(cache), "--build-dir", str(build_dir)])
            capsys.readouterr()
            records = {json.loads(r.read_text())["task"]: json.loads(r.read_text())
                       for r in build_dir.glob("stages/*/*/stage.json")}
            planted = {t for t, r in records.items() if r["cache_key"] == manifest["key"] and r["from_cache"]}
            plan = make_plan(load_specs([root / "configs"]), build_dir, STAGES)
            for t in plan.tasks.values():
                rec = records.get(t.name)
                if rec is None or not rec["from_cache"]:
                    continue
                assert not set(t.deps) & planted, f"round {round_}: {t.name} restored beside planted {planted}"
    finally:
        os.chdir(old)


def _complete(stage_dir: Path) -> bool:
    """A task's records as a finished run leaves them: stage.json and inputs.json, of one key."""
    try:
        return json.loads((stage_dir / "stage.json").read_text())["key"] == \
            json.loads((stage_dir / "inputs.json").read_text())["key"]
    except (OSError, ValueError, KeyError):
        return False


def test_fuzzed_full_disks_are_one_line_and_lose_nothing(tmp_path: Path):
    """Build dirs on tmpfs filesystems of seeded sizes, from 32 KiB to all a build needs: whatever write finds
    the disk full says so in one line naming it, nothing is blamed on an input or called internal, and once
    there is room the build completes from what was finished, with nothing half-written taken as done (root
    only: the tests/engine/test_full_disk.py injected cases run everywhere)."""
    root = tmp_path / "p"
    tiny_project(root, 1)
    measure = subprocess.run([sys.executable, "-m", "npubuild", "build", "-q", "--cache", "off", "--build-dir",
                              str(tmp_path / "whole")], cwd=root, capture_output=True, text=True, timeout=600)
    assert measure.returncode == 0, measure.stderr
    need = sum(p.stat().st_size for p in (tmp_path / "whole").rglob("*") if p.is_file()) // 1024
    rng = random.Random(SEED + 40)
    for round_ in range(3):
        disk = tmp_path / f"disk{round_}"
        disk.mkdir()
        kib = rng.randrange(32, need)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(disk)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        try:
            build = [sys.executable, "-m", "npubuild", "build", "-q", "--cache", "off", "--build-dir", str(disk / "b")]
            proc = subprocess.run(build, cwd=root, capture_output=True, text=True, timeout=600)
            lines = proc.stderr.splitlines()
            assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, (kib, proc.stderr)
            assert all(f"no space left on device: {disk} (a " in ln for ln in lines), (kib, proc.stderr)
            done = {p.parent for p in (disk / "b").glob("stages/*/*/stage.json") if _complete(p.parent)}
            subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
            again = subprocess.run(build, cwd=root, capture_output=True, text=True, timeout=600)
            assert again.returncode == 0, (kib, again.stderr)
            run = json.loads((disk / "b" / "run.json").read_text())
            redone = {t for t in run["executed"] if (disk / "b" / "stages" / t.replace(":", "/", 1)) in done}
            assert not redone, (kib, redone)
        finally:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
