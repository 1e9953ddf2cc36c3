"""The calibration statistics: histograms numpy's per sample, however they are gathered."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.ptq import ranges
from npubuild.frontend.ptq.stats import BINS, collect, reordered


def _model() -> onnx.ModelProto:
    """relu -> transpose -> reshape -> tanh: two tensors that hold the relu's values reordered."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["f"]), helper.make_node("Tanh", ["f"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 40, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4800])],
                          [numpy_helper.from_array(np.array([1, 4800], np.int64), "shape")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _calibration() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(4).standard_t(3.0, (6, 1, 3, 40, 40)).astype(np.float32)}


def test_histograms_are_numpys_per_sample_and_shared_by_reordered_tensors():
    """Each tensor's histogram is the sum of np.histogram over its own values per sample in its range, for the
    tensors counted and for the Transpose and Reshape outputs that take the Relu's histogram."""
    x = _calibration()["x"]
    assert reordered(_model(), ["x", "r", "t", "f", "y"]) == {"t": "r", "f": "r"}
    got = collect(_model(), {"x": x})
    values = {"x": list(x), "r": [np.maximum(s, 0) for s in x]}
    values["t"] = [s.transpose(0, 2, 3, 1) for s in values["r"]]
    values["f"] = [s.reshape(1, -1) for s in values["t"]]
    values["y"] = [np.tanh(s) for s in values["f"]]
    for name, samples in values.items():
        if name == "y":  # float rounding of tanh: onnxruntime's own values, per sample, are what it counts
            continue
        lo, hi = got[name].lo, got[name].hi
        expect = sum(np.histogram(s.ravel(), bins=BINS, range=(lo, hi))[0].astype(np.float64) for s in samples)
        np.testing.assert_array_equal(got[name].hist, expect)
    assert got["y"].hist.sum() == x.size


def test_minmax_estimators_need_no_histogram():
    """collect(histograms=False) (what choose() asks when only minmax / mean_minmax are wanted) gives those
    estimators the same ranges as the full statistics, with no histogram counted."""
    x = _calibration()
    full, bare = collect(_model(), x), collect(_model(), x, histograms=False)
    assert set(full) == set(bare) == {"x", "r", "t", "f", "y"}
    for est in set(ranges.ESTIMATORS) - ranges.HISTOGRAM_ESTIMATORS:
        assert ranges.overrides(full, est, False) == ranges.overrides(bare, est, False)
    assert all(s.hist.any() for s in full.values()) and not any(s.hist.any() for s in bare.values())


def test_non_finite_values_are_left_out_of_ranges_and_histograms():
    """Samples holding NaN, +inf and -inf (x / x for x = 0, Log of 0 and of inf): each tensor's per-sample min and
    max and its histogram are those of its finite values only, as numpy gives them on the filtered values."""
    nodes = [helper.make_node("Div", ["x", "x"], ["d"]), helper.make_node("Log", ["x"], ["l"]),
             helper.make_node("Add", ["d", "l"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(5).uniform(0.1, 4.0, (5, 1, 64)).astype(np.float32)
    x[1, 0, :3] = 0.0  # d: NaN there; l: -inf
    x[3, 0, 5] = np.inf  # d: NaN; l: +inf; x itself: +inf
    got = collect(model, {"x": x})
    with np.errstate(all="ignore"):
        values = {"x": x, "d": x / x, "l": np.log(x)}
    values["y"] = values["d"] + values["l"]
    for name, samples in values.items():
        finite = [s[np.isfinite(s)] for s in samples]
        np.testing.assert_array_equal(got[name].sample_min, [f.min() for f in finite])
        np.testing.assert_array_equal(got[name].sample_max, [f.max() for f in finite])
        lo, hi = got[name].lo, got[name].hi
        if hi > lo:  # d (x / x) is 1 wherever finite: a constant tensor has no histogram
            expect = sum(np.histogram(f, bins=BINS, range=(lo, hi))[0].astype(np.float64) for f in finite)
            np.testing.assert_array_equal(got[name].hist, expect)
    assert got["d"].lo == got["d"].hi == 1.0 and not got["d"].hist.any()
    assert 0 < got["y"].hist.sum() < x.size  # the non-finite values were left out
