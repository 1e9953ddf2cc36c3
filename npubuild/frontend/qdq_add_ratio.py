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
(share_concat_scales runs first). An Add's parameters, once in ratio, stay as they are for later Adds.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.frontend.qdq_concat import SCALE_PRESERVING

STEPS = 64  # the larger operand's weight: a power of two (see the module docstring), the largest int8 holds
MAX_COARSEN = 1.0 / 32  # the most one operand's scale grows by


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


def snap_add_ratios(model: onnx.ModelProto) -> int:
    """Rewrite (in place) one operand scale of each int8 Add / Sub of two rank-4 activations of one shape, each
    read by it alone (the sums the depthwise form can take), so that the smaller is p / 64 of the larger;
    returns how many scales changed."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = list(model.graph.node)
    q_nodes: dict[str, list[onnx.NodeProto]] = {}  # scale initializer -> the QuantizeLinears using it
    dq_of: dict[str, onnx.NodeProto] = {}  # tensor -> the DequantizeLinear producing it
    q_by_output: dict[str, onnx.NodeProto] = {}
    concat_touched: set[str] = set()  # tensors a Concat reads or writes, through their Q / DQ
    for n in nodes:
        if n.op_type == "QuantizeLinear" and len(n.input) >= 2:
            q_nodes.setdefault(n.input[1], []).append(n)
            q_by_output[n.output[0]] = n
        elif n.op_type == "DequantizeLinear":
            dq_of[n.output[0]] = n
    for n in nodes:
        if n.op_type == "Concat":
            concat_touched.update(n.input)
            concat_touched.update(n.output)
    quantized_by = {q.output[0]: q.input[0] for q in q_by_output.values()}
    concat_scales = set()
    for n in nodes:
        if n.op_type == "QuantizeLinear" and (n.input[0] in concat_touched):
            concat_scales.add(n.input[1])
        if n.op_type == "DequantizeLinear" and n.output[0] in concat_touched:
            concat_scales.add(n.input[1])

    def activation_scale(tensor: str) -> str | None:
        """The scale initializer of an int8 per-tensor activation read through a DequantizeLinear."""
        dq = dq_of.get(tensor)
        if dq is None or len(dq.input) < 3 or dq.input[0] not in quantized_by:
            return None
        s, z = inits.get(dq.input[1]), inits.get(dq.input[2])
        if s is None or z is None or z.data_type != onnx.TensorProto.INT8 or numpy_helper.to_array(s).size != 1:
            return None
        return dq.input[1]

    outputs = {o.name for o in model.graph.output}
    readers: dict[str, list[onnx.NodeProto]] = {}  # a quantised tensor -> the nodes reading it but its Qs' DQs
    producer = {o: n for n in nodes for o in n.output}
    for n in nodes:
        for i in n.input:
            dq = dq_of.get(i)
            if dq is not None and dq.input[0] in quantized_by:
                readers.setdefault(quantized_by[dq.input[0]], []).append(n)
            elif n.op_type != "QuantizeLinear":  # read in float, past its Q
                readers.setdefault(i, []).append(n)

    shapes = _shapes(model)

    def sole_reader(tensor: str, add: onnx.NodeProto) -> bool:
        """Whether `add` alone reads the value behind `tensor` (a DequantizeLinear output)."""
        source = quantized_by.get(dq_of[tensor].input[0]) if tensor in dq_of else None
        return source is not None and source not in outputs and all(r is add for r in readers.get(source, []))

    def movable(scale: str, add: onnx.NodeProto) -> bool:
        """Whether `scale` is one tensor's alone (one QuantizeLinear, no Concat, not yet settled) and that tensor
        is computed by an op that sets its own output grid (not one that moves values on its input's)."""
        qs = q_nodes.get(scale, [])
        if len(qs) != 1 or scale in concat_scales or scale in settled:
            return False
        made_by = producer.get(qs[0].input[0])
        return made_by is not None and made_by.op_type not in SCALE_PRESERVING | {"Pad", "Concat", "Split"}

    def value(scale: str) -> float:
        return float(numpy_helper.to_array(inits[scale]).reshape(-1)[0])

    settled: set[str] = set()
    changed = 0
    for n in nodes:
        if n.op_type not in ("Add", "Sub") or len(n.input) != 2:
            continue
        ka, kb = activation_scale(n.input[0]), activation_scale(n.input[1])
        if ka is None or kb is None:
            continue
        if not all(sole_reader(t, n) and shapes.get(t) == shapes.get(n.input[0]) and len(shapes.get(t) or ()) == 4
                   for t in n.input):
            continue
        sa, sb = value(ka), value(kb)
        options = []
        for move, fixed, s_move, s_fixed in ((kb, ka, sb, sa), (ka, kb, sa, sb)):
            new = coarsened(s_move, s_fixed) if movable(move, n) and move != fixed else None
            if new is not None:
                options.append((new / s_move - 1.0, move, float(np.float32(new))))
        if weights(sa, sb) is None and options:
            grow, move, new = min(options)
            if grow <= MAX_COARSEN:
                old = numpy_helper.to_array(inits[move])
                inits[move].CopyFrom(numpy_helper.from_array(np.full(old.shape, new, old.dtype), move))
                changed += 1
        if weights(value(ka), value(kb)) is not None:
            settled.update((ka, kb))
    return changed
