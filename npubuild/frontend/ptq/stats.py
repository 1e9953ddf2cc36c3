"""Activation statistics of the float model on the calibration data: what every range estimator reads.

One onnxruntime session with every float tensor exposed, run twice over the samples: the first pass
records each tensor's per-sample minimum and maximum, the second a histogram over the tensor's whole
calibration range (so bins are fixed before any value is counted, and no sample is held in memory). The
second pass is most of the time (2048-bin histograms of every activation of every sample, np.histogram's
counts by ptq/histogram.py in half its time) and only the percentile and mse estimators read it: it is
skipped when neither is wanted, and a tensor that holds another's values reordered (a Transpose, Reshape... output: PERMUTING) takes that tensor's histogram, as
np.histogram over the same values in the same range counts the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from npubuild.frontend.ptq.histogram import Histogram, Scratch
from npubuild.frontend.ptq.session import session_options

BINS = 2048
# ops whose output holds exactly the values of their first input, reordered
PERMUTING = frozenset({"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "DepthToSpace",
                       "SpaceToDepth"})


@dataclass
class TensorStats:
    """One activation tensor over the calibration samples."""

    sample_min: np.ndarray  # float64 [samples]
    sample_max: np.ndarray  # float64 [samples]
    hist: np.ndarray = field(default_factory=lambda: np.zeros(BINS, np.float64))  # counts over [lo, hi]

    @property
    def lo(self) -> float:
        return float(self.sample_min.min())

    @property
    def hi(self) -> float:
        return float(self.sample_max.max())

    def edges(self) -> np.ndarray:
        return np.linspace(self.lo, self.hi, BINS + 1)


def float_tensors(model: onnx.ModelProto) -> list[str]:
    """Graph inputs and node outputs of float type (the tensors onnxruntime's quantiser may give a Q/DQ pair)."""
    if len(model.graph.value_info) < len(model.graph.node) // 2:  # types of the intermediate tensors
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - the model's own value_info is all there is to go on
            pass
    typed = {vi.name: vi.type.tensor_type.elem_type for vi in (*model.graph.value_info, *model.graph.input,
                                                                 *model.graph.output)}
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    names += [o for n in model.graph.node if n.op_type != "Constant" for o in n.output if o]
    return [n for n in dict.fromkeys(names) if typed.get(n) == TensorProto.FLOAT]


def exposing(model: onnx.ModelProto, names: list[str]) -> bytes:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names if n not in have)
    return m.SerializeToString()


def collect(model: onnx.ModelProto, arrays: dict[str, np.ndarray],
            histograms: bool = True) -> dict[str, TensorStats]:
    """Per-sample min/max and (with `histograms`) a BINS-bin histogram of every float tensor of `model` over
    `arrays`; without, every histogram stays empty."""
    import onnxruntime as ort

    names = float_tensors(model)
    session = ort.InferenceSession(exposing(model, names), session_options(), providers=["CPUExecutionProvider"])
    feeds_names = {i.name for i in session.get_inputs()}
    n = next(iter(arrays.values())).shape[0]
    feeds = [{k: np.asarray(v[i]) for k, v in arrays.items() if k in feeds_names} for i in range(n)]
    graph_in = set(feeds_names)
    mins = {k: np.empty(n) for k in names}
    maxs = {k: np.empty(n) for k in names}
    finite = {k: np.empty(n, bool) for k in names}  # every value of the sample finite
    for i, fd in enumerate(feeds):
        for k, v in zip(names, _run(session, names, fd, graph_in), strict=True):
            mins[k][i], maxs[k][i], finite[k][i] = _finite_range(v)
    stats = {k: TensorStats(mins[k], maxs[k]) for k in names}
    if not histograms:
        return stats
    same = {k: src for k, src in reordered(model, names).items()  # the same values on every sample
            if np.array_equal(mins[k], mins[src]) and np.array_equal(maxs[k], maxs[src])}
    scratch = Scratch()  # one set of block buffers for every histogram: they are filled one at a time
    hists = {k: Histogram(s.lo, s.hi, BINS, scratch) for k, s in stats.items() if s.hi > s.lo and k not in same}
    for i, fd in enumerate(feeds):  # np.histogram's counts over a finite range count only the finite values
        for k, v in zip(names, _run(session, names, fd, graph_in), strict=True):
            if k in hists:
                hists[k].add(v, bool(finite[k][i]))
    for k, h in hists.items():  # the per-sample counts' sum: integers, exact in float64 as they were added
        stats[k].hist += h.total()
    for k, src in same.items():
        stats[k].hist = stats[src].hist.copy()
    return stats


def reordered(model: onnx.ModelProto, names: list[str]) -> dict[str, str]:
    """Each of `names` that a PERMUTING node makes from another of them (through a chain of such nodes, the
    first tensor of the chain): tensor -> the tensor whose values it holds."""
    known = set(names)
    source: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type in PERMUTING and n.domain in ("", "ai.onnx") and n.input and n.input[0] in known \
                and len(n.output) == 1 and n.output[0] in known:
            source[n.output[0]] = n.input[0]
    for k, src in source.items():
        while src in source:  # the chain's first tensor, whatever order the nodes come in
            src = source[src]
        source[k] = src
    return source


def _run(session, names: list[str], feeds: dict[str, np.ndarray], graph_in: set[str]) -> list[np.ndarray]:
    """Each tensor's values, flat (float32: converting every activation to float64 cost as much as the run)."""
    run_names = [k for k in names if k not in graph_in]
    outs = dict(zip(run_names, session.run(run_names, feeds), strict=True))
    return [np.asarray(feeds[k] if k in graph_in else outs[k]).ravel() for k in names]


def _finite_range(v: np.ndarray) -> tuple[float, float, bool]:
    """The min and max of `v`'s finite values ((0, 0) if none), and whether every value is finite. A NaN makes
    min and max NaN and an inf makes one of them infinite, so finite min and max mean every value is finite:
    only then is the filter skipped (it was a float64 sum over every value before)."""
    if v.size:
        lo, hi = v.min(), v.max()
        if np.isfinite(lo) and np.isfinite(hi):
            return float(lo), float(hi), True
        v = v[np.isfinite(v)]
    return (float(v.min()), float(v.max()), False) if v.size else (0.0, 0.0, False)
