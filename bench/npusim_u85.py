"""Time npu-sim on MobileNetV1 0.25 (96x96, configs/vww.yaml) for every Ethos-U85 size (and U55-128 beside them).

A benchmark script, not a test: it prints a markdown table (bench/npusim_u85.md keeps the results). Run it
from the project root:

    PYTHONPATH=. python bench/npusim_u85.py [--build-dir /tmp/npusim-bench] [--runs 5]

It builds the spec with raw-output targets (Performance and Size) through `npubuild build` (the npu-sim
stage checks each artifact bit-exact on the spec's samples as part of it), then per artifact times one
simulation with the weight-decode caches cleared (cold: a fresh process's first inference) and the median
of --runs more (warm: every later sample of a verification), on one seeded input, and checks that input
bit-exact against the TOSA reference model.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
SIZES = [("ethos-u55-128", "Performance")] + [(f"ethos-u85-{m}", opt) for m in (128, 256, 512, 1024, 2048)
                                              for opt in ("Performance", "Size")]


def _targets() -> list[dict]:
    return [{"extends": a, "name": f"{a.removeprefix('ethos-')}-{o.lower()}",
             "vela": {"output_format": "raw", "optimise": o}} for a, o in SIZES]


def _build(build_dir: Path) -> Path:
    root = build_dir / "product"
    if root.exists():
        shutil.rmtree(root)
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# benchmark project\n")
    shutil.copy(ROOT / "configs" / "models" / "mobilenet_v1.onnx", root / "configs" / "models")
    spec = yaml.safe_load((ROOT / "configs" / "vww.yaml").read_text())
    spec["targets"] = _targets()
    spec.pop("expect", None)
    (root / "configs" / "vww.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", "configs", "--build-dir", "build", "-n", "2",
                           "-q", "--progress", "plain"], cwd=root, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stdout + proc.stderr)
    return root / "build"


def _clear_caches() -> None:
    from npubuild.npusim import weights
    from npubuild.npusim.u85 import weights as weights85

    for fn in (weights.decode_cached, weights85.stream_order, weights85.fwd_order):
        fn.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    from npubuild.npusim.artifact import locate
    from npubuild.npusim.npz import load_raw
    from npubuild.npusim.sim import run
    from npubuild.npusim.verify import compare

    with tempfile.TemporaryDirectory() as tmp:
        build = _build(args.build_dir or Path(tmp))
        print("| accelerator | optimise | NPU ops | cold s | warm s (median) | bit-exact |")
        print("|---|---|---:|---:|---:|---|")
        for accel, opt in SIZES:
            art = locate(str(build), f"{accel.removeprefix('ethos-')}-{opt.lower()}")
            model = load_raw(art.npz)
            spec = art.io.inputs[0]
            x = spec.to_tosa(np.random.default_rng(0).uniform(-1, 1, spec.onnx_shape).astype(np.float32))
            _clear_caches()
            t0 = time.perf_counter()
            res = run(model, [x])
            cold = time.perf_counter() - t0
            warm = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                run(model, [x])
                warm.append(time.perf_counter() - t0)
            verdict = compare(model, art.tosa.read_bytes(), [[x]], [o.onnx_name for o in art.io.outputs])
            print(f"| {accel} | {opt} | {len(res.ops)} | {cold:.2f} | {statistics.median(warm):.2f} | "
                  f"{'yes' if verdict.bitexact else 'NO'} |")


if __name__ == "__main__":
    main()
