"""Entropy (KL-divergence) calibration with a histogram fine enough to choose anything but the full range.

onnxruntime's quantize_static runs its entropy calibrator with 128 histogram
bins and 128 quantised bins, so the KL search has a single candidate, the
full range: "entropy" silently equals "minmax". Here the calibrator runs with
2048 bins (as TensorRT's does) and its ranges go to quantize_static as
per-tensor overrides.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

NUM_BINS = 2048
NUM_QUANTIZED_BINS = 128


class _Rows(CalibrationDataReader):
    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays, self.i = arrays, 0
        self.n = next(iter(arrays.values())).shape[0]

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= self.n:
            return None
        self.i += 1
        return {k: v[self.i - 1] for k, v in self.arrays.items()}


def entropy_options(float_model: Path, arrays: dict[str, np.ndarray], q: dict) -> dict:
    """Extra quantize_static options for the spec's calibration method (only entropy needs any)."""
    if q["method"] != "entropy":
        return {}
    return {"TensorQuantOverrides": entropy_overrides(float_model, _Rows(arrays), q["symmetric_activations"])}


def entropy_overrides(float_model: Path, reader: CalibrationDataReader, symmetric: bool) -> dict[str, list[dict]]:
    """TensorQuantOverrides giving every activation its KL-optimal range on the calibration data."""
    with tempfile.TemporaryDirectory(prefix="npubuild-entropy-") as tmp:
        cal = create_calibrator(str(float_model), None, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                calibrate_method=CalibrationMethod.Entropy,
                                extra_options={"num_bins": NUM_BINS, "num_quantized_bins": NUM_QUANTIZED_BINS,
                                               "symmetric": symmetric})
        cal.collect_data(reader)
        data = cal.compute_data()
    out = {}
    for name, td in data.data.items():
        lo, hi = (float(np.asarray(v).ravel()[0]) for v in td.range_value)
        out[name] = [{"rmin": np.float32(min(lo, 0.0)), "rmax": np.float32(max(hi, 0.0))}]
    return out
