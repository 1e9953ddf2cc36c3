"""ONNX's backend node tests through the command line: `npubuild build` on one spec per test, and what
each build ends as (passed, failed with a one-line error of kind input / stage / internal).

    python bench/conformance_cli.py --work /tmp/conf-cli [--selection conformance|all] [--only SUBSTRING]
                                    [--targets ethos-u85-256 ...] [-n 2] [--out bench/conformance_cli.md]

Where bench/conformance.py runs the stages' functions in process on the embedded ops' tests (and
checks their numbers), this drives the CLI as a user would. `--selection conformance` (the default): the
same 699 tests as tests/conformance (embedded ops, float inputs), each prepared as it prepares them (the
op's parameters and int64 inputs made constants: nodetests.load), which is the suite the issue's five
Cast crashes came from. `--selection all`: every test under onnx/backend/test/data/node as it is (shapes,
scales and indices left as graph inputs). Each test's model goes into a project in --work, calibrated on the test's
own input data (an .npz keyed by input name; seeded random samples where that data holds NaN/inf, which
calibration refuses, or a type numpy cannot hold), built with `npubuild build --keep-going`. It counts the
builds by status and error kind from report.json and lists every internal error (kind `internal`: an
exception inside npubuild, which must never happen) with its line; a build whose error line is not one
line, or a run whose exit code is not 0/1/2, is counted too. Numbers are not compared here (conformance.py
does that).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

NODE_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,79}$")


def _inputs(test: Path) -> dict[str, np.ndarray] | None:
    """The test's first data set, keyed by the model's input names (None if it cannot be read)."""
    model = onnx.load(str(test / "model.onnx"), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    data = test / "test_data_set_0"
    files = sorted(data.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
    arrays = {}
    for name, f in zip(names, files, strict=False):
        try:
            arrays[name] = numpy_helper.to_array(onnx.load_tensor(str(f)))
        except Exception:  # noqa: BLE001 - a type numpy cannot hold (int4, float8...): the build gets no data
            return None
        a = arrays[name]
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            return None  # the tests of inf/NaN handling: calibration refuses such data, so random samples instead
    return arrays


def _cases(selection: str, only: str) -> list[tuple[str, onnx.ModelProto | Path, dict | None]]:
    """(name, model or its file, input arrays or None) per test of the selection."""
    if selection == "all":
        return [(t.name, t / "model.onnx", _inputs(t)) for t in sorted(NODE_DIR.iterdir())
                if (t / "model.onnx").is_file() and only in t.name]
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "conformance"))
    from nodetests import load, select

    out = []
    for case in select():
        if only in case.name:
            loaded = load(case)
            finite = all(np.isfinite(a).all() for a in loaded.inputs.values() if a.dtype.kind == "f")
            out.append((case.name, loaded.model, dict(loaded.inputs) if finite and loaded.inputs else None))
    return out


def assemble(work: Path, selection: str, only: str, targets: list[str]) -> int:
    for sub in ("models", "data", "specs"):
        if (work / sub).exists():
            shutil.rmtree(work / sub)
        (work / sub).mkdir(parents=True)
    (work / "pyproject.toml").touch()
    count = 0
    for name, model, arrays in _cases(selection, only):
        if not NAME_OK.match(name):
            continue
        if isinstance(model, Path):
            shutil.copy2(model, work / "models" / f"{name}.onnx")
        else:
            onnx.save(model, work / "models" / f"{name}.onnx")
        calibration = "{random: {samples: 2, seed: 0}}"
        if arrays:
            try:  # one sample each: a leading axis (a rank-0 input's value alone reads as no samples)
                np.savez(work / "data" / f"{name}.npz", **{k: np.asarray(v)[None] for k, v in arrays.items()})
                calibration = f"{{npy: ../data/{name}.npz}}"
            except (TypeError, ValueError):
                pass
        (work / "specs" / f"{name}.yaml").write_text(
            f"version: 1\nname: {name}\nmodels:\n  model:\n    path: ../models/{name}.onnx\n"
            f"    calibration: {calibration}\ntargets: [{', '.join(targets)}]\nverify: {{tosa: true, samples: 2}}\n")
        count += 1
    return count


def summarise(report: dict) -> tuple[str, list[str]]:
    builds = report["builds"]
    kinds: Counter[str] = Counter()
    internal = []
    for b in builds:
        if b["status"] != "failed":
            kinds[b["status"]] += 1
            continue
        for k in b.get("error_kinds") or ["?"]:
            kinds[f"failed: {k}"] += 1
        if "internal" in (b.get("error_kinds") or []):
            internal.append(f"{b['spec']}/{b['target']}: {(b.get('errors') or ['?'])[0]}")
        if any("\n" in e for e in b.get("errors") or []):
            kinds["failed: error not one line"] += 1
    rows = ["| outcome | builds |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in sorted(kinds.items())]
    rows.append(f"| total | {len(builds)} |")
    return "\n".join(rows), internal


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--selection", choices=["conformance", "all"], default="conformance")
    ap.add_argument("--only", default="")
    ap.add_argument("--targets", nargs="+", default=["ethos-u85-256"])
    ap.add_argument("-n", "--jobs", default="2")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    work = args.work.resolve()
    n = assemble(work, args.selection, args.only, args.targets)
    cmd = [sys.executable, "-m", "npubuild", "build", str(work / "specs"), "--build-dir", str(work / "build"),
           "--keep-going", "-q", "-n", args.jobs]
    print(f"{n} node tests; $ {' '.join(cmd)}", flush=True)
    run = subprocess.run(cmd, cwd=work, check=False, capture_output=True, text=True)
    report = json.loads((work / "build" / "report.json").read_text())
    table, internal = summarise(report)
    text = (f"{n} ONNX node tests ({args.selection}; onnx {onnx.__version__}) through `npubuild build`, targets "
            f"{', '.join(args.targets)}; exit code {run.returncode}\n\n{table}\n\ninternal errors: {len(internal)}\n"
            + "".join(f"- {line}\n" for line in internal))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0 if run.returncode in (0, 1, 2) and not internal else 1


if __name__ == "__main__":
    sys.exit(main())
