"""QDQ post-pass: the two activation operands of an Add or Sub get scales in the ratio p / 64.

npubuild's int8 Add is TFLite's: the operand of the larger scale s_L widened by 2**19, the other by
(s_S / s_L) 2**19, summed, rescaled once; Vela runs it as one elementwise op, which the U55 costs at 1.5 cycles
an element. Where s_S / s_L is p / 64 (p = 1..64), both widenings are integers, the sum is 2**13 times
64 (L - z_L) + p (S - z_S), and one 1x2 depthwise conv of int8 weights (64, p) computes the same integers:
a third of the ADD's U55 cycles (lowering/ops/elementwise.py; bench/u55_add_dw.md). The larger weight stays a
power of two because the NPU's elementwise add scales only one operand: an ADD whose two widenings are both
other integers (23 and 4, say) Vela 5.2 compiles into an op npu-sim does not reproduce.

onnxruntime calibrates each operand on its own, so their ratio is arbitrary: this pass coarsens one operand's
scale by the least factor that makes it p / 64, where that is at most 1/32 (at most 0.27 dB of that operand's
own resolution; the sum's noise is mostly the larger operand's and the output's). Only an operand whose
parameters belong to it alone moves: its QuantizeLinear is the only one using that scale (not a value-moving
op's output named on its input's, not a tied recurrent state's) and no Concat reads or writes it
(share_concat_scales runs first). An Add's parameters, once in ratio, stay as they are for later Adds. The
quantize stage keeps the ratios only where the QDQ model scores no worse against float on its calibration data
(snap_if_free), and records what it did in the recipe (`add_ratio`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.frontend.graph_index import GraphIndex
from npubuild.frontend.qdq_concat import SCALE_PRESERVING

if TYPE_CHECKING:
    from npubuild.frontend.ptq.choose import Scorer

STEPS = 64  # the larger operand's weight: a power of two (see the module docstring), the largest int8 holds
MAX_COARSEN = 1.0 / 32  # the most one operand's scale grows by
# the most the ratios may cost, worst output and mean, on the calibration data (frontend/ptq/choose.Scorer)
SNAP_TOLERANCE_DB = 0.1


def weights(s_a: float, s_b: float, rel_tol: float = 1e-6) -> tuple[int, int] | None:
    """(w_a, w_b): STEPS for the operand of the larger scale and p for the other, where the smaller scale is
    p / STEPS of the larger to rel_tol (float32 scales), or None. The lowering's test for the exact forms:
    rel_tol keeps a ratio this pass made and admits an accidental one only where it is that close."""
    small, large = min(s_a, s_b), max(s_a, s_b)
    p = round(small / large * STEPS)
    if p < 1 or abs(p / STEPS - small / large) > rel_tol * small / large:
        return None
    return (STEPS, p) if s_a >= s_b else (p, STEPS)


def coarsened(s_move: float, s_fixed: float) -> float | None:
    """The least scale >= s_move that is p / STEPS or STEPS / p of s_fixed (p in 1..STEPS), or None."""
    r = s_move / s_fixed
    if r <= 1.0:  # the moved operand is the smaller: up to the next p / STEPS
        p = int(np.ceil(r * STEPS - 1e-9))
        return s_fixed * p / STEPS if 1 <= p <= STEPS else None
    p = int(np.floor(STEPS / r + 1e-9))  # the larger: up until the other is p / STEPS of it
    return s_fixed * STEPS / p if 1 <= p <= STEPS else None


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Each value's static shape, where ONNX shape inference finds one."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 -- a model shape inference cannot follow: no shapes, no Add is moved
        return {}
    shapes = {}
    for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        dims = v.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = tuple(d.dim_value for d in dims)
    return shapes


class _QdqView:
    """What the pass reads of a QDQ model: each activation's Q / DQ nodes, readers, producer and shape."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.inits = {t.name: t for t in model.graph.initializer}
        self.nodes = list(model.graph.node)
        self.q_nodes: dict[str, list[onnx.NodeProto]] = {}  # scale initializer -> the QuantizeLinears using it
        self.dq_of: dict[str, onnx.NodeProto] = {}  # tensor -> the DequantizeLinear producing it
        quantized_by: dict[str, str] = {}  # a Q's output -> the float tensor it quantises
        for n in self.nodes:
            if n.op_type == "QuantizeLinear" and len(n.input) >= 2:
                self.q_nodes.setdefault(n.input[1], []).append(n)
                quantized_by[n.output[0]] = n.input[0]
            elif n.op_type == "DequantizeLinear":
                self.dq_of[n.output[0]] = n
        self.quantized_by = quantized_by
        self.index = GraphIndex(model)  # producers, and readers through Q / DQ copies (the lowering's own view)
        concat_touched: set[str] = set()  # tensors a Concat reads or writes
        for n in self.nodes:
            if n.op_type == "Concat":
                concat_touched.update((*n.input, *n.output))
        self.concat_scales = {n.input[1] for n in self.nodes
                              if (n.op_type == "QuantizeLinear" and n.input[0] in concat_touched)
                              or (n.op_type == "DequantizeLinear" and n.output[0] in concat_touched)}
        self.shapes = _shapes(model)

    def scale_of(self, tensor: str) -> str | None:
        """The scale initializer of an int8 per-tensor activation read through a DequantizeLinear."""
        dq = self.dq_of.get(tensor)
        if dq is None or len(dq.input) < 3 or dq.input[0] not in self.quantized_by:
            return None
        s, z = self.inits.get(dq.input[1]), self.inits.get(dq.input[2])
        if s is None or z is None or z.data_type != onnx.TensorProto.INT8 or numpy_helper.to_array(s).size != 1:
            return None
        return dq.input[1]

    def value(self, scale: str) -> float:
        return float(numpy_helper.to_array(self.inits[scale]).reshape(-1)[0])

    def sole_reader(self, tensor: str, node: onnx.NodeProto) -> bool:
        """Whether `node` alone reads the value behind `tensor` (a DequantizeLinear output) and that value is no
        graph output: the test the lowering's depthwise form makes (ops/elementwise._only_reader)."""
        source = self.index.source(tensor)
        readers = self.index.uses(source, [])
        return source != tensor and not self.index.reaches_output(source) and \
            [list(r.output) for r in readers] == [list(node.output)]

    def movable(self, scale: str) -> bool:
        """Whether `scale` is one tensor's alone (one QuantizeLinear, no Concat) and that tensor is computed by an
        op that sets its own output grid (not one that moves values on its input's)."""
        qs = self.q_nodes.get(scale, [])
        if len(qs) != 1 or scale in self.concat_scales:
            return False
        made_by = self.index.producer.get(qs[0].input[0])
        return made_by is not None and made_by.op_type not in SCALE_PRESERVING | {"Pad", "Concat", "Split"}

    def sums(self) -> list[tuple[onnx.NodeProto, str, str]]:
        """(node, scale of input 0, scale of input 1) of each int8 Add / Sub of two rank-4 activations of one
        shape, each read by it alone: the sums the depthwise form can take."""
        found = []
        for n in self.nodes:
            if n.op_type not in ("Add", "Sub") or len(n.input) != 2:
                continue
            ka, kb = self.scale_of(n.input[0]), self.scale_of(n.input[1])
            shape = self.shapes.get(n.input[0])
            if ka is None or kb is None or shape is None or len(shape) != 4:
                continue
            if all(self.sole_reader(t, n) and self.shapes.get(t) == shape for t in n.input):
                found.append((n, ka, kb))
        return found


def snap_add_ratios(model: onnx.ModelProto) -> int:
    """Rewrite (in place) one operand scale of each sum the depthwise form can take (_QdqView.sums) so that the
    smaller is p / 64 of the larger; returns how many scales changed."""
    view = _QdqView(model)
    settled: set[str] = set()
    changed = 0
    for _, ka, kb in view.sums():
        sa, sb = view.value(ka), view.value(kb)
        if weights(sa, sb) is None:
            options = []
            for move, s_move, s_fixed in ((kb, sb, sa), (ka, sa, sb)):
                new = coarsened(s_move, s_fixed) if move not in settled and view.movable(move) and ka != kb else None
                if new is not None:
                    options.append((new / s_move - 1.0, move, float(np.float32(new))))
            if options and min(options)[0] <= MAX_COARSEN:
                _, move, new = min(options)
                old = numpy_helper.to_array(view.inits[move])
                view.inits[move].CopyFrom(numpy_helper.from_array(np.full(old.shape, new, old.dtype), move))
                changed += 1
        if weights(view.value(ka), view.value(kb)) is not None:
            settled.update((ka, kb))
    return changed


def depthwise_sums(model: onnx.ModelProto) -> int:
    """How many sums of the QDQ model the depthwise form takes: those of _QdqView.sums in a 64ths ratio."""
    view = _QdqView(model)
    return sum(weights(view.value(ka), view.value(kb)) is not None for _, ka, kb in view.sums())


def snap_if_free(qdq: onnx.ModelProto, float_model: onnx.ModelProto, arrays: dict[str, np.ndarray],
                 scorer_of: Callable[[], Scorer] | None = None,
                 scored: tuple[float, float] | None = None) -> dict | None:
    """The ratios of snap_add_ratios, kept (in place) only where they cost no accuracy: the QDQ model with them,
    scored against float on the calibration samples as the quantize stage scores its recipes, may lose at most
    SNAP_TOLERANCE_DB on its worst output and on the mean. A near-collapse model moves by more than any
    coarsening's own noise under any perturbation (MediaPipe face detection -0.28 dB worst, held-out -1.3; palm
    detection mean -0.16, held-out -0.8), and a ratio only pays where U55 takes the depthwise form. Returns the
    record (None where no sum could take a ratio). `scorer_of` and `scored`: the recipe choice's Scorer and its
    score of `qdq`, where it made one (the same measures, not made twice)."""
    trial = onnx.ModelProto()
    trial.CopyFrom(qdq)
    moved = snap_add_ratios(trial)
    if not moved:
        return None
    if scorer_of is None:  # the PTQ package, imported here: kept out of the lower stage's imports
        from npubuild.frontend.ptq.choose import Scorer as FloatScorer

        scorer = FloatScorer(float_model, arrays)
    else:
        scorer = scorer_of()
    before = scored if scored is not None else scorer.score(qdq)
    after = scorer.score(trial)
    kept = all(a >= b - SNAP_TOLERANCE_DB for a, b in zip(after, before, strict=True))
    if kept:
        qdq.CopyFrom(trial)
    return {"moved": moved, "kept": kept, "snr_db": [round(before[0], 2), round(after[0], 2)],
            "mean_snr_db": [round(before[1], 2), round(after[1], 2)]}
