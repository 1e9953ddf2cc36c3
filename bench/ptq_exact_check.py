"""The PTQ statistics' histograms and the MSE search's errors on a real model, against their plain numpy forms.

    PYTHONPATH=<tree> .venv/bin/python bench/ptq_exact_check.py BUILD_DIR --spec-dir DIR [--samples N]

A check script, not part of npubuild (issue 33: /work/notes/issue-33-quantize-own3.md). BUILD_DIR is a cold
build's; its import stage's float model is run on the first N calibration samples of the quantize stage's config:
every tensor's histogram from ptq/stats.collect (ptq/histogram.py's count, one set of block buffers for all)
must equal the sum of np.histogram's counts over the samples, and every tensor's MSE candidate errors
(ptq/ranges.quant_mse, rows in blocks) the one-matrix form's, symmetric and not. Prints the counts of tensors
checked and of differences (0 expected).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from npbtest.ptq_reference import one_matrix  # noqa: E402


def candidates(s, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """mse()'s candidate ranges for `s`."""
    from npubuild.frontend.ptq import ranges

    lo, hi = min(s.lo, 0.0), max(s.hi, 0.0)
    if symmetric:
        a = max(-lo, hi) * ranges.SHRINK
        return -a, a
    f, g = np.meshgrid(ranges.SHRINK if lo < 0 else np.ones(1), ranges.SHRINK if hi > 0 else np.ones(1), indexing="ij")
    others = [ranges.percentile(s), ranges.mean_minmax(s)]
    return (np.concatenate([(lo * f).ravel(), [min(o[0], 0.0) for o in others]]),
            np.concatenate([(hi * g).ravel(), [max(o[1], 0.0) for o in others]]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir", type=Path)
    ap.add_argument("--spec-dir", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=8)
    args = ap.parse_args()

    import onnxruntime as ort

    from npubuild.config.schema import Calibration
    from npubuild.frontend.data import calibration_arrays
    from npubuild.frontend.ptq import ranges, stats

    record = json.loads(next((args.build_dir / "stages" / "quantize").glob("*/stage.json")).read_text())
    config = record["config"]
    model = onnx.load(str(next((args.build_dir / "stages" / "import").glob("*/model.onnx"))))
    npy = config["calibration"].get("npy")
    arrays = calibration_arrays(model, Calibration.model_validate(config["calibration"]).model_dump(),
                                args.spec_dir / npy if npy else None)
    arrays = {k: v[:args.samples] for k, v in arrays.items()}
    collected = stats.collect(model, arrays)

    names = stats.float_tensors(model)
    session = ort.InferenceSession(stats.exposing(model, names), stats.session_options(),
                                   providers=["CPUExecutionProvider"])
    feeds_names = {i.name for i in session.get_inputs()}
    expect = {k: np.zeros(stats.BINS, np.intp) for k, s in collected.items() if s.hi > s.lo}
    for i in range(args.samples):
        feeds = {k: np.asarray(v[i]) for k, v in arrays.items() if k in feeds_names}
        for k, v in zip(names, stats._run(session, names, feeds, feeds_names), strict=True):
            if k in expect:
                expect[k] += np.histogram(v, bins=stats.BINS, range=(collected[k].lo, collected[k].hi))[0]
    hist_diff = sum(not np.array_equal(collected[k].hist, expect[k]) for k in expect)
    mse_checked = mse_diff = 0
    for s in collected.values():
        if max(s.hi, 0.0) - min(s.lo, 0.0) <= 0 or s.hist.sum() == 0:
            continue
        for symmetric in (False, True):
            los, his = candidates(s, symmetric)
            mse_checked += 1
            mse_diff += not np.array_equal(ranges.quant_mse(s, los, his), one_matrix(s, los, his))
    print(json.dumps({"build": args.build_dir.name, "samples": args.samples, "histograms": len(expect),
                      "histogram_differences": int(hist_diff), "mse_searches": mse_checked,
                      "mse_differences": int(mse_diff)}))


if __name__ == "__main__":
    main()
