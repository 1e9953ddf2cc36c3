"""Accuracy and speed of real models' builds, npubuild trees side by side: what an import rewrite changes.

    PYTHONPATH=. .venv/bin/python bench/real_idioms.py --real /work/real --heldout <dir> --work /tmp/idioms \
        --tree before=/path/to/old/tree --tree after=. --only ppocrv4_det_160 ppocr_cls_48x192 [--out bench/real_idioms.md]

A benchmark script, not part of npubuild. --real is a copy of shared/models/real with its calibration made;
--heldout holds bench/real_heldout.py's held-back inputs (other draws made as the calibration is). Each spec is
built cold by each tree (`npubuild build --cache off`), and per build the table gives the deployed integer graph's
SNR against the float model on the held-back inputs (bench/real_routes.py's measure: the worst output, every
sample's error over every sample's signal), Vela's inference ms, SRAM and off-chip KiB, and the build's status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_routes import accuracy, float_outputs, npubuild_outputs, onnx_input_shapes  # noqa: E402


def build(real: Path, spec: str, tree: Path, build_dir: Path) -> dict:
    """A cold build of specs/<spec>.yaml by `tree`; its report."""
    cmd = [sys.executable, "-m", "npubuild", "build", f"specs/{spec}.yaml", "--build-dir", str(build_dir),
           "--cache", "off", "-q"]
    subprocess.run(cmd, cwd=real, env={**os.environ, "PYTHONPATH": str(tree)}, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((build_dir / "report.json").read_text())


def held_back(real: Path, heldout: Path, name: str) -> dict[str, np.ndarray]:
    shapes = onnx_input_shapes(real / "onnx" / f"{name}.onnx")
    with np.load(heldout / f"{name}.npz") as z:  # [samples, *ONNX input shape] (make_real drops batch dims)
        return {k: z[k].astype(np.float32).reshape(len(z[k]), *shapes[k]) for k in z.files}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, required=True)
    ap.add_argument("--heldout", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--tree", action="append", required=True, help="name=path of an npubuild checkout")
    ap.add_argument("--only", nargs="+", required=True, help="spec names under <real>/specs")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    lines = ["| model | tree | target | status | SNR vs float dB (held-back) | inference ms | SRAM KiB | off-chip KiB |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for name in args.only:
        held = held_back(args.real, args.heldout, name)
        ref = float_outputs(args.real / "onnx" / f"{name}.onnx", held)
        for tree_name, tree in trees:
            report = build(args.real, name, tree, args.work / f"{tree_name}-{name}")
            cache: dict = {}
            for e in report["builds"]:
                m = e.get("metrics", {})
                snr = accuracy(ref, npubuild_outputs(e, held, cache))
                lines.append(f"| {name} | {tree_name} | {e['target']} | {e['status']} | {snr} | "
                             f"{m.get('inference_ms')} | {m.get('sram_kib')} | {m.get('offchip_kib')} |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
