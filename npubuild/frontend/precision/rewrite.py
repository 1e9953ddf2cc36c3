"""A precision plan applied to the int8 QDQ model: int16 activation groups and int4 weights, still a QDQ model.

- An int16 group gets one symmetric scale (TOSA's int16 tensors have zero point 0) covering every member's
  calibration range: at 16 bits the clipping a range estimator trades against int8's rounding costs more
  than it saves, so the whole range (min/max of the calibration statistics) is kept.
- A reader with no int16 form on a target family (rules.py) reads an int8 copy: a QuantizeLinear ->
  DequantizeLinear pair with the activation's int8 parameters, which the lowering turns into one RESCALE.
- int4 weights are per output channel and symmetric in [-7, 7] (so a negated weight stays in range), each
  channel's scale the one of 11 candidate clips of its peak with the least squared error (at 4 bits the
  largest weight is rarely worth its grid: NNCF's and GPTQ's weight-only 4-bit rounding search the clip too).
- onnxruntime's asymmetric int8 model drops a Relu (or a Clip at 0) and lets the int8 grid, which starts at 0,
  clip the negatives; a symmetric int16 grid does not, so a promoted activation whose int8 grid starts at 0 gets
  the Relu back (its producer -> Q/DQ at the int16 scale -> Relu -> the activation's Q), a CLAMP Vela fuses.
- A bias whose input or weight scale changed is requantised to the new accumulator scale from its real values
  (the bias the int8 model had, bias correction included), with a coarser scale where int32 would overflow.
- Q/DQ of 16 and 4 bits are ONNX from opset 21: an older model is converted as onnxruntime's quantiser does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.frontend.passes import HOST_REASON, KEPT_FLOAT
from npubuild.frontend.precision.qdq import DQ, MOVEMENT, Activation, Q, QdqModel
from npubuild.frontend.precision.rules import reads_int16, writes_int16

INT16_MAX = 32767
INT4_MAX = 7
CLIPS = np.linspace(0.5, 1.0, 11)  # candidate fractions of a channel's peak weight for its int4 scale
QDQ_OPSET = 21


@dataclass(frozen=True)
class PrecisionPlan:
    """Which activation groups are int16, which layers' weights are int4 and which activations stay float, their
    producers on the host (everything else int8)."""

    int16: frozenset[str] = frozenset()
    int4: frozenset[str] = frozenset()
    floats: frozenset[str] = frozenset()  # activations (not groups: no shared grid to keep) the spec keeps in float

    @property
    def empty(self) -> bool:
        return not self.int16 and not self.int4 and not self.floats

    def to_json(self) -> dict:
        return {"int16": sorted(self.int16), "int4": sorted(self.int4),
                **({"float": sorted(self.floats)} if self.floats else {})}

    @classmethod
    def from_json(cls, d: Mapping) -> PrecisionPlan:
        return cls(frozenset(d.get("int16", ())), frozenset(d.get("int4", ())), frozenset(d.get("float", ())))


def constants_of(info: QdqModel) -> set[str]:
    """Initializers and the DequantizeLinear outputs of initializers: what the rules treat as constant."""
    out = set(info.inits)
    for n in info.model.graph.node:
        if n.op_type == DQ and n.input[0] in info.inits:
            out.add(n.output[0])
    return out


def promotable(info: QdqModel, group: str, families: Iterable[str], constants: set[str] | None = None) -> str | None:
    """None if the group can be int16 on every family, else why not (a producer without an int16 form)."""
    constants = constants if constants is not None else constants_of(info)
    for a in info.groups[group].activations:
        p = info.activations[a].producer
        if p is not None and p.op_type not in (Q, DQ) and not writes_int16(p, families, constants):
            return f"{p.op_type} '{p.name}' has no int16 form"
    return None


def _range(act: Activation, ranges: Mapping[str, tuple[float, float]] | None) -> tuple[float, float]:
    if ranges:
        for key in (act.name, act.name.removesuffix("_QuantizeLinear_Input")):
            if key in ranges:
                return ranges[key]
    return act.real_range


KNOT_STEP = 128  # int16 inputs between two knots of TOSA's interpolating int16 TABLE (lowering/table.py)


def kinks(node: onnx.NodeProto) -> tuple[float, ...]:
    """Where a piecewise function a reader computes bends: HardSwish at -3 and 3, HardSigmoid where it reaches 0
    and 1. An int16 TABLE follows a bend exactly only if it falls on a knot."""
    attrs = {a.name: a.f for a in node.attribute}
    if node.op_type == "HardSwish":
        return (-3.0, 3.0)
    if node.op_type == "HardSigmoid":
        alpha, beta = attrs.get("alpha", 0.2), attrs.get("beta", 0.5)
        return (-beta / alpha, (1 - beta) / alpha) if alpha else ()
    return ()


def int16_scale(info: QdqModel, group: str, ranges: Mapping[str, tuple[float, float]] | None) -> float:
    """One symmetric int16 scale covering every member's range. A group read by a HardSwish or HardSigmoid whose
    bends are +-c gets the nearest larger scale c / (128 k) instead (at most 1/k coarser, k ~ 100): its bends
    then sit on knots of the reader's int16 TABLE, which is one op where the integer form of the bend is seven
    (bench/precision_examples.md: a MobileNetV3 hard swish 14x the cycles of its int8 TABLE on U85-256)."""
    acts = info.groups[group].activations
    peak = max(max(abs(lo), abs(hi)) for a in acts for lo, hi in [_range(info.activations[a], ranges)])
    if not np.isfinite(peak) or peak <= 0:
        peak = max(info.activations[a].scale for a in acts) * 128
    scale = peak / INT16_MAX
    bends = {abs(k) for a in acts for node, _ in info.activations[a].readers for k in kinks(node)}
    if len(bends) == 1 and (c := bends.pop()) > 0 and c / (KNOT_STEP * scale) >= 1:
        scale = c / (KNOT_STEP * np.floor(c / (KNOT_STEP * scale)))
    return float(np.float32(scale))


def int4_weights(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Real weights -> (int4 codes in [-7, 7], per-channel scales along `axis`; one scale if None): each
    channel's clip the candidate with the least squared rounding error."""
    if axis is None:
        w2 = w.reshape(1, -1)
    else:
        w2 = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)
    peak = np.max(np.abs(w2), axis=1)
    peak = np.where(peak > 0, peak, 1.0)
    best_err = np.full(w2.shape[0], np.inf)
    best_scale = peak / INT4_MAX
    for clip in CLIPS:
        s = peak * clip / INT4_MAX
        q = np.clip(np.round(w2 / s[:, None]), -INT4_MAX, INT4_MAX)
        err = ((q * s[:, None] - w2) ** 2).sum(axis=1)
        better = err < best_err
        best_err, best_scale = np.where(better, err, best_err), np.where(better, s, best_scale)
    best_scale = best_scale.astype(np.float32).astype(np.float64)
    q = np.clip(np.round(w2 / best_scale[:, None]), -INT4_MAX, INT4_MAX)
    if axis is None:
        return q.reshape(w.shape).astype(np.int8), best_scale.astype(np.float32)
    moved = (w.shape[axis], *[d for i, d in enumerate(w.shape) if i != axis])
    return np.moveaxis(q.reshape(moved), 0, axis).astype(np.int8), best_scale.astype(np.float32)


class _Writer:
    """New initializers and nodes for the rewritten model, uniquely named."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.names = {t.name for t in model.graph.initializer} | {o for n in model.graph.node for o in n.output}
        self.node_names = {n.name for n in model.graph.node}

    def unique(self, base: str, taken: set[str]) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    def init(self, base: str, value: np.ndarray) -> str:
        name = self.unique(base, self.names)
        self.model.graph.initializer.append(numpy_helper.from_array(value, name))
        return name


def _dq_array(info: QdqModel, dq: onnx.NodeProto, k: int) -> np.ndarray | None:
    return info.array(dq.input[k]) if len(dq.input) > k and dq.input[k] else None


def _dequantized(info: QdqModel, dq: onnx.NodeProto) -> tuple[np.ndarray, int | None]:
    """The real values (float64) of a DequantizeLinear of an initializer, and its quantisation axis (None: one
    scale for the whole tensor)."""
    data, scale = info.array(dq.input[0]), info.array(dq.input[1])
    assert data is not None and scale is not None
    axis = _weight_axis(dq, data.ndim, scale)
    shape = [1] * data.ndim
    if axis is not None:
        shape[axis] = -1
    q = data.astype(np.float64)
    zp = _dq_array(info, dq, 2)
    if zp is not None and np.any(zp):
        q = q - zp.astype(np.float64).reshape(shape if zp.size > 1 else [1] * data.ndim)
    return q * scale.astype(np.float64).reshape(shape), axis


def _weight_axis(dq: onnx.NodeProto, ndim: int, scale: np.ndarray) -> int | None:
    if scale.size == 1:
        return None
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    return axis + ndim if axis < 0 else axis


def _set_qparams(node: onnx.NodeProto, scale: str, zp: str) -> None:
    while len(node.input) < 3:
        node.input.append("")
    node.input[1], node.input[2] = scale, zp


def apply_plan(int8: onnx.ModelProto, plan: PrecisionPlan, families: Iterable[str],
               ranges: Mapping[str, tuple[float, float]] | None = None) -> onnx.ModelProto:
    """The int8 QDQ model with `plan` applied (a new model; `int8` is not changed). `ranges` are the float
    calibration ranges per activation (frontend/ptq/stats.py) the int16 scales cover; without them the int8
    grid's own range is kept."""
    model = onnx.ModelProto()
    model.CopyFrom(int8)
    if plan.empty:
        return model
    families = tuple(families)
    info = QdqModel(model)
    keep_float(info, plan.floats)
    constants = constants_of(info)
    writer = _Writer(model)
    scales: dict[str, float] = {}  # activation -> its int16 scale
    for group in sorted(plan.int16):
        if group not in info.groups:
            raise ValueError(f"no activation group '{group}' in the model")
        if promotable(info, group, families, constants) is None:
            s = int16_scale(info, group, ranges)
            scales.update({a: s for a in info.groups[group].activations if a not in plan.floats})
    for a, s in scales.items():
        act = info.activations[a]
        sc = writer.init(f"{a}_scale16", np.array(s, np.float32))
        zp = writer.init(f"{a}_zero_point16", np.array(0, np.int16))
        for node in (act.q, *act.dqs):
            _set_qparams(node, sc, zp)
        if _floor_dropped_here(info, act):
            _restore_relu(info, writer, act, sc, zp)
    weight_scales = {name: _to_int4(info, writer, name) for name in sorted(plan.int4) if name in info.layers}
    _requantize_biases(info, writer, scales, weight_scales)
    _insert_converts(info, writer, scales, families, constants)
    _drop_unused_initializers(model)
    if any(o.domain in ("", "ai.onnx") and o.version < QDQ_OPSET for o in model.opset_import):
        model = onnx.version_converter.convert_version(model, QDQ_OPSET)
        _constants_as_initializers(model)
    return model


def _constants_as_initializers(model: onnx.ModelProto) -> None:
    """The version converter writes what became an input (a ReduceMax's axes from opset 18) as a Constant node:
    an initializer, as every other constant of the model is (a Constant node on its own is no partition's work)."""
    graph = model.graph
    for node in [n for n in graph.node if n.op_type == "Constant" and len(n.attribute) == 1]:
        value = helper.get_attribute_value(node.attribute[0])
        array = numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(
            value, np.float32 if node.attribute[0].name.startswith("value_float") else np.int64)
        graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
        graph.node.remove(node)


def keep_float(info: QdqModel, activations: Iterable[str]) -> None:
    """The activations' producers compute in float on the host (their host reason on the node: the lowering
    refuses them, the partitioner places them); a reader that is one of them reads the float tensor itself, any
    other the quantised copy its Q/DQ pair still makes (an NPU layer, a graph output); a pair left unread goes.
    The readers left are the activation's, for the int16 rewrite that follows."""
    acts = [info.activations[a] for a in sorted(activations)]
    for a in acts:
        if a.producer is None:
            raise ValueError(f"activation '{a.name}' is a graph input: nothing computes it on the host")
    on_host = {id(a.producer): a.producer for a in acts}
    graph = info.model.graph
    for node in on_host.values():
        node.doc_string = HOST_REASON + KEPT_FLOAT
        _float_constants(info, node)
    for a in acts:
        keep = []
        for node, i in a.readers:
            if id(node) in on_host:
                node.input[i] = a.name
            else:
                keep.append((node, i))
        a.readers = keep
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for a in acts:
        for dq in [dq for dq in a.dqs if dq.output[0] not in read]:
            graph.node.remove(dq)
            a.dqs.remove(dq)
        if not a.dqs:
            graph.node.remove(a.q)
    for dq in [n for n in graph.node if n.op_type == DQ and n.input[0] in info.inits and n.output[0] not in read]:
        graph.node.remove(dq)  # a constant's DequantizeLinear only float layers read: they read its values


def _float_constants(info: QdqModel, node: onnx.NodeProto) -> None:
    """A float layer reads its constants (weights, biases) as float initializers holding the dequantised values:
    the same numbers, but a float op, as the host runs it. onnxruntime's optimiser turns a MatMul of a
    DequantizeLinear'd weight into an integer MatMul with the activation quantised on the fly (on
    oww_melspectrogram's power spectrum: 51 dB from the float op), which neither the QDQ model nor TensorFlow Lite
    Micro's float FULLY_CONNECTED computes."""
    for i, name in enumerate(node.input):
        dq = info.producer.get(name)
        if dq is None or dq.op_type != DQ or dq.input[0] not in info.inits:
            continue
        float_name = f"{name}_float"
        if float_name not in info.inits:
            init = numpy_helper.from_array(_dequantized(info, dq)[0].astype(np.float32), float_name)
            info.model.graph.initializer.append(init)
            info.inits[float_name] = init
        node.input[i] = float_name


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    """The int8 scales, zero points, weights and biases the plan replaced (onnxruntime warns about each)."""
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def _floor_dropped_here(info: QdqModel, act: Activation) -> bool:
    """Whether onnxruntime dropped a Relu whose floor at 0 only this activation's int8 grid keeps. Data movement
    keeps its input's floor, so it has one of its own only where its input's grid did not start at 0 (a Relu
    after an Unsqueeze of a tensor others read too: Silero's LSTM output, 12.3 -> 5.3 dB in 16x8 without it)."""
    if act.zero_point != -128 or act.producer is None or act.producer.op_type in (Q, DQ, "Relu"):
        return False
    if act.producer.op_type not in MOVEMENT:
        return True
    source = info.read_activation(act.producer, 0)
    return source is not None and source.zero_point != -128


def _restore_relu(info: QdqModel, writer: _Writer, act: Activation, scale: str, zp: str) -> None:
    """producer -> Q -> DQ (int16, the activation's scale) -> Relu -> the activation's own Q: the floor at 0 the
    int8 grid gave, as an op."""
    pre = writer.unique(f"{act.name}_before_relu", writer.names)
    for i, o in enumerate(act.producer.output):  # type: ignore[union-attr]
        if o == act.name:
            act.producer.output[i] = pre  # type: ignore[union-attr]
    q_out, dq_out = writer.unique(f"{pre}_quantized", writer.names), writer.unique(f"{pre}_dequantized", writer.names)
    nodes = [helper.make_node(Q, [pre, scale, zp], [q_out], name=writer.unique(f"{pre}_q", writer.node_names)),
             helper.make_node(DQ, [q_out, scale, zp], [dq_out], name=writer.unique(f"{pre}_dq", writer.node_names)),
             helper.make_node("Relu", [dq_out], [act.name], name=writer.unique(f"{act.name}_relu", writer.node_names))]
    graph = info.model.graph
    at = next(i for i, n in enumerate(graph.node) if n is act.q or n.name == act.q.name)
    for k, n in enumerate(nodes):
        graph.node.insert(at + k, n)


def _to_int4(info: QdqModel, writer: _Writer, layer: str) -> np.ndarray:
    """Layer's int8 weight DequantizeLinear rewritten to int4; returns the new per-channel scales."""
    dq = info.layers[layer].weight_dq
    scale = info.array(dq.input[1])
    assert scale is not None
    real, axis = _dequantized(info, dq)
    q, s4 = int4_weights(real, axis)
    dq.input[0] = writer.init(f"{dq.input[0]}_int4", q.astype(ml_dtypes.int4))
    s4 = s4.reshape(scale.shape)
    _set_qparams(dq, writer.init(f"{dq.input[1]}_int4", s4), writer.init(f"{dq.input[0]}_zero_point",
                                                                          np.zeros(s4.shape, ml_dtypes.int4)))
    return s4.astype(np.float64).reshape(-1)


def _bias_dqs(info: QdqModel, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The int32 bias DequantizeLinears at a weighted layer's accumulator scale: its input 2, or the bias of
    the Add a constant-weight MatMul was folded with (frontend/qdq_linear.py)."""
    names = [node.input[2]] if node.op_type != "MatMul" and len(node.input) > 2 and node.input[2] else []
    if node.op_type == "MatMul":
        names = [i for add, _ in info.consumers.get(node.output[0], []) if add.op_type == "Add" for i in add.input]
    out = []
    for name in names:
        dq = info.producer.get(name)
        if dq is not None and dq.op_type == DQ and dq.input[0] in info.inits:
            data = info.array(dq.input[0])
            if data is not None and data.dtype == np.int32:
                out.append(dq)
    return out


def _requantize_biases(info: QdqModel, writer: _Writer, scales: Mapping[str, float],
                       weight_scales: Mapping[str, np.ndarray]) -> None:
    for name, layer in info.layers.items():
        node = layer.node
        act = info.read_activation(node, 0)
        s_in_changed = act is not None and act.name in scales
        if not s_in_changed and name not in weight_scales:
            continue
        s_in = scales[act.name] if s_in_changed else (act.scale if act is not None else None)
        if s_in is None:
            continue
        w_scale = weight_scales.get(name)
        if w_scale is None:
            w_scale = info.array(layer.weight_dq.input[1]).astype(np.float64).reshape(-1)  # type: ignore[union-attr]
        for dq in _bias_dqs(info, node):
            b, sb = info.array(dq.input[0]), info.array(dq.input[1])
            assert b is not None and sb is not None
            real = b.astype(np.float64) * sb.astype(np.float64).reshape(-1)
            new = np.broadcast_to(np.float64(s_in) * w_scale, real.shape).astype(np.float32).astype(np.float64)
            while np.any(np.abs(np.round(real / new)) > np.iinfo(np.int32).max):
                new = new * 2.0  # an int32 bias cannot hold it at the accumulator's scale: the lowering's int48 can
            q = np.round(real / new).astype(np.int32)
            dq.input[0] = writer.init(f"{dq.input[0]}_requantized", q.reshape(b.shape))
            _set_qparams(dq, writer.init(f"{dq.input[1]}_requantized", new.astype(np.float32).reshape(sb.shape)),
                         writer.init(f"{dq.input[0]}_zero_point", np.zeros(sb.shape, np.int32)))


def _insert_converts(info: QdqModel, writer: _Writer, scales: Mapping[str, float], families: tuple[str, ...],
                     constants: set[str]) -> None:
    """An int8 copy (Q -> DQ at the activation's int8 parameters) for every reader with no int16 form."""
    graph = info.model.graph
    additions: list[tuple[int, list[onnx.NodeProto]]] = []
    for a in scales:
        act = info.activations[a]
        copy_name: str | None = None
        for node, i in act.readers:
            if node.op_type in (Q, DQ) or reads_int16(node, i, families, constants):
                continue
            if copy_name is None:
                q8 = writer.unique(f"{a}_int8", writer.names)
                copy_name = writer.unique(f"{a}_int8_dequantized", writer.names)
                q = helper.make_node(Q, [node.input[i], writer.init(f"{a}_scale8", np.array(act.scale, np.float32)),
                                         writer.init(f"{a}_zero_point8", np.array(act.zero_point, np.int8))], [q8],
                                     name=writer.unique(f"{a}_to_int8", writer.node_names))
                dq = helper.make_node(DQ, [q8, q.input[1], q.input[2]], [copy_name],
                                      name=writer.unique(f"{a}_int8_dq", writer.node_names))
                additions.append((act.dqs[0].name if act.dqs else None, [q, dq]))
            node.input[i] = copy_name
    for after, nodes in additions:  # each right after the DQ it reads (graph order stays topological)
        at = next((k + 1 for k, n in enumerate(graph.node) if n.name == after), 0)
        for k, n in enumerate(nodes):
            graph.node.insert(at + k, n)
