"""Activation range estimators: from the calibration statistics to each tensor's int8 [rmin, rmax].

- `minmax`: the whole calibration range (onnxruntime's default); one outlier sample sets the grid.
- `mean_minmax`: the mean over samples of each sample's own min and max, as TFLite's and NNCF's
  activation ranges (an outlier in one sample moves the range by 1/N of its excess).
- `percentile`: all but 0.001% of the magnitudes (onnxruntime's Percentile, from the histogram).
- `mse`: the range whose int8 grid gives the least expected squared error over the tensor's histogram
  (rounding noise scale^2/12 inside, the clipped distance outside): the per-tensor error-optimal clip.
"""

from __future__ import annotations

import numpy as np

from npubuild.frontend.ptq.stats import TensorStats

LEVELS = 255  # int8: 256 levels, 255 steps
SHRINK = np.linspace(0.04, 1.0, 25)  # candidate fractions of the calibration range kept at each end
MSE_BINS = 256  # the histogram merged for the MSE search (2048 bins cost 8x the time for the same choice)
MSE_ROWS = 64  # candidates whose errors are computed at once (64 x 256 float64: 128 KiB, in cache)


def minmax(s: TensorStats) -> tuple[float, float]:
    return s.lo, s.hi


def mean_minmax(s: TensorStats) -> tuple[float, float]:
    return float(s.sample_min.mean()), float(s.sample_max.mean())


def percentile(s: TensorStats, keep: float = 99.999) -> tuple[float, float]:
    """onnxruntime's Percentile at its defaults: the magnitude t that all but (100 - keep)% of |x| stay within,
    the range [-t, t] bounded by the calibration min and max (so a Relu output keeps [0, t])."""
    total = s.hist.sum()
    if total == 0:
        return s.lo, s.hi
    edges = s.edges()
    centres = np.abs((edges[:-1] + edges[1:]) / 2)
    order = np.argsort(centres, kind="stable")
    cdf = np.cumsum(s.hist[order]) / total
    k = min(int(np.searchsorted(cdf, keep / 100.0)), len(order) - 1)
    t = float(centres[order[k]] + (edges[1] - edges[0]) / 2)
    return max(-t, s.lo), min(t, s.hi)


def quant_mse(s: TensorStats, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Expected squared int8 error of the histogram for each candidate range [lo[j], hi[j]] (0 within it), on
    the histogram merged to MSE_BINS bins (the search costs candidates x bins).

    Each candidate's error is the sum of its own row of per-bin errors, so the rows are computed MSE_ROWS at a
    time in buffers that stay in cache (the whole matrix, 627 x 256 float64 on an asymmetric tensor, went through
    memory about ten times: 3 ms a tensor, ~0.6 ms now). The per-bin errors are the same numbers as one matrix
    gives: the clip as np.maximum then np.minimum (lo <= 0 <= hi, no NaN), a centre within the range where the
    clip leaves it unchanged, each row summed on its own as numpy sums a contiguous row (tests/frontend/
    test_ptq_ranges.py compares with the one-matrix form)."""
    edges = s.edges()[:: len(s.hist) // MSE_BINS]
    hist = s.hist.reshape(MSE_BINS, -1).sum(axis=1)[None, :]
    centres = (edges[:-1] + edges[1:]) / 2
    lo_, hi_ = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    step = np.maximum(hi_ - lo_, 1e-30) / LEVELS
    noise = (step[:, None] ** 2) / 12.0  # the rounding noise within the range
    x = centres[None, :]
    rows = min(MSE_ROWS, len(lo_))
    buffer, inside_buffer = np.empty((rows, x.size)), np.empty((rows, x.size), bool)
    out = np.empty(len(lo_))
    for start in range(0, len(lo_), MSE_ROWS):
        part = slice(start, start + MSE_ROWS)
        lo_col, hi_col = lo_[part, None], hi_[part, None]
        err, inside = buffer[:lo_col.shape[0]], inside_buffer[:lo_col.shape[0]]
        np.maximum(x, lo_col, out=err)
        np.minimum(err, hi_col, out=err)  # the centres clipped to the range
        np.equal(err, x, out=inside)
        np.subtract(x, err, out=err)
        np.square(err, out=err)  # the clipped distance outside
        np.copyto(err, noise[part], where=inside)
        np.multiply(err, hist, out=err)
        out[part] = err.sum(axis=1)
    return out


def mse(s: TensorStats, symmetric: bool = False) -> tuple[float, float]:
    """The candidate range with the least expected squared error (each end shrunk by its own fraction)."""
    lo, hi = min(s.lo, 0.0), max(s.hi, 0.0)
    if hi - lo <= 0 or s.hist.sum() == 0:
        return lo, hi
    if symmetric:
        a = max(-lo, hi) * SHRINK
        los, his = -a, a
    else:
        f, g = np.meshgrid(SHRINK if lo < 0 else np.ones(1), SHRINK if hi > 0 else np.ones(1), indexing="ij")
        los, his = (lo * f).ravel(), (hi * g).ravel()
        others = [percentile(s), mean_minmax(s)]  # so that no other estimator's range can have less error
        los = np.concatenate([los, [min(o[0], 0.0) for o in others]])
        his = np.concatenate([his, [max(o[1], 0.0) for o in others]])
    best = int(np.argmin(quant_mse(s, los, his)))
    return float(los[best]), float(his[best])


FIXED_RANGES = {"Softmax": (0.0, 1.0)}  # onnxruntime's own rule for a Softmax output (exactly 1/255 per step)


def fixed_ranges(model) -> dict[str, tuple[float, float]]:
    """Tensors whose range is the op's, not the data's."""
    return {n.output[0]: FIXED_RANGES[n.op_type] for n in model.graph.node if n.op_type in FIXED_RANGES}


ESTIMATORS = {"minmax": minmax, "percentile": percentile, "mean_minmax": mean_minmax, "mse": mse}
HISTOGRAM_ESTIMATORS = frozenset({"percentile", "mse"})  # the others read only the per-sample min and max


def overrides(stats: dict[str, TensorStats], estimator: str, symmetric: bool,
              fixed: dict[str, tuple[float, float]] | None = None) -> dict[str, list[dict]]:
    """onnxruntime TensorQuantOverrides giving every calibrated tensor the estimator's range, or its `fixed` one."""
    out = {}
    for name, s in stats.items():
        if fixed and name in fixed:
            lo, hi = fixed[name]
        else:
            lo, hi = mse(s, symmetric) if estimator == "mse" else ESTIMATORS[estimator](s)
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        if symmetric:
            lo, hi = -max(-lo, hi), max(-lo, hi)
        out[name] = [{"rmin": np.float32(lo), "rmax": np.float32(hi)}]
    return out
