"""Held-back inputs for the real models: made as their calibration is, from other draws.

A benchmark helper of bench/real_routes.py. Runs with a Python that has what make_real.py needs (onnx,
onnxruntime, scikit-image; espeak-ng and sox for the audio): the lead's /work/scratch/realgen/s/venv.

    python bench/real_heldout.py --real /work/scratch/perf/real --out DIR [--samples 8] [--seed 1]

It runs the real set's own make_real.make_calib with its random generator seeded `--seed` instead of 0 and
`--samples` samples per model: other crops of the bundled photos, other positions in the audio and other noise,
the same preprocessing. Writes DIR/<model>.npz keyed by ONNX input name (each [samples, *input shape]).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

import numpy


class _SeededNumpy:
    """numpy, but np.random.default_rng(s) gives the generator of s + offset (make_calib seeds it with 0)."""

    def __init__(self, offset: int):
        self._offset = offset

    def __getattr__(self, name):
        if name == "random":
            return _SeededRandom(self._offset)
        return getattr(numpy, name)


class _SeededRandom:
    def __init__(self, offset: int):
        self._offset = offset

    def default_rng(self, seed=None):
        return numpy.random.default_rng((seed or 0) + self._offset)

    def __getattr__(self, name):
        return getattr(numpy.random, name)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, required=True, help="a copy of shared/models/real (make_real.py, onnx/)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    spec = importlib.util.spec_from_file_location("make_real", args.real / "make_real.py")
    mr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mr)
    mr.N_CALIB = args.samples
    mr.np = _SeededNumpy(args.seed)
    import onnx

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "calib"
        mr.make_calib(args.real / "onnx", raw, Path(tmp))
        for f in sorted(raw.iterdir()):
            model = onnx.load(str(args.real / "onnx" / f"{f.stem}.onnx"), load_external_data=False)
            inits = {i.name for i in model.graph.initializer}
            names = [i.name for i in model.graph.input if i.name not in inits]
            if f.suffix == ".npz":
                with numpy.load(f) as z:
                    arrays = {k: z[k] for k in z.files}
            else:
                arrays = {names[0]: numpy.load(f)}
            numpy.savez(args.out / f"{f.stem}.npz", **arrays)
    print(f"held-back inputs for {len(list(args.out.glob('*.npz')))} models in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
