"""QDQ post-pass: a recurrent state's input is quantised on the grid of the output fed back into it.

A model run step by step (Silero VAD's `stateN -> state`, an LSTM's h/c exported as I/O) gets its state
output back as an input at the next call. Calibrated apart, the two sides get two int8 grids, so the
application must dequantise the output's codes and quantise them again on the input's grid every call:
a second rounding per step that compounds over a stream, and a float loop on the Cortex-M. At run time
the input only ever holds the zero initial state (exact on any int8 grid) or what the output held, so the
output's grid is the right one for it: the codes then go straight back (a copy) and a step adds no
rounding of its own. What it buys is the device's loop, not accuracy: on Silero VAD over 250 windows
(five range estimators) the decisions moved by at most two windows either way (-0.4..+0.8 points of
agreement with float) and the output SNR by -1.1..+1.5 dB (bench/real_models.md, Silero's notes).

The input's grid reaches the ops that only move its values (Gather, Slice, Reshape..., whose output
onnxruntime quantises with their input's parameters): they are moved with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.errors import InputError
from npubuild.frontend.qdq_concat import SCALE_PRESERVING, Key

__all__ = ["check_feedback", "tie_feedback"]


def check_feedback(model: onnx.ModelProto, feedback: Mapping[str, str]) -> None:
    """Each pair names an output and an input of the model, of one shape and element type (one line, exit 2)."""
    inputs = {i.name: i.type.tensor_type for i in model.graph.input}
    outputs = {o.name: o.type.tensor_type for o in model.graph.output}
    for out, inp in feedback.items():
        if out not in outputs:
            raise InputError(f"feedback: '{out}' is not an output of the model (outputs: {', '.join(outputs)})")
        if inp not in inputs:
            raise InputError(f"feedback: '{inp}' is not an input of the model (inputs: {', '.join(inputs)})")
        o, i = outputs[out], inputs[inp]
        if o.elem_type != i.elem_type or _dims(o) != _dims(i):
            raise InputError(f"feedback: output '{out}' {_dims(o)} and input '{inp}' {_dims(i)} differ in shape or "
                             "type: one cannot be fed back as the other")


def _dims(t: onnx.TypeProto.Tensor) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim]


def tie_feedback(qdq: onnx.ModelProto, feedback: Mapping[str, str]) -> dict[str, str]:
    """Put each fed-back input (and what moves its values unchanged) on its output's grid, in place. Returns
    the pairs tied; a pair whose either side is not quantised per tensor in one type (an output left in
    float for the host, a 16-bit side) is left as it is and not returned."""
    inits = {t.name: t for t in qdq.graph.initializer}
    tied = {}
    for out, inp in feedback.items():
        grid = _output_key(qdq, out)
        keys = _input_keys(qdq, inp, inits)
        if grid is None or not keys or not all(_same_type(inits, grid, k) for k in keys):
            continue
        scale, zero = (numpy_helper.to_array(inits[n]) for n in grid)
        if scale.size != 1:
            continue
        for k in keys:
            for name, value in zip(k, (scale, zero), strict=True):
                if name in grid:
                    continue
                old = numpy_helper.to_array(inits[name])
                inits[name].CopyFrom(numpy_helper.from_array(np.full(old.shape, value.reshape(-1)[0], old.dtype),
                                                             name))
        tied[out] = inp
    return tied


def _output_key(qdq: onnx.ModelProto, out: str) -> Key | None:
    """The (scale, zero point) of the DequantizeLinear that produces graph output `out`, if one does."""
    for n in qdq.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] == out and len(n.input) == 3:
            return n.input[1], n.input[2]
    return None


def _input_keys(qdq: onnx.ModelProto, inp: str, inits: dict[str, onnx.TensorProto]) -> list[Key]:
    """The keys of the input's QuantizeLinear and of every value-moving op downstream that shares its grid
    (the same parameters): the tensors that hold the input's codes unchanged."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in qdq.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    keys: list[Key] = []
    first = [n for n in consumers.get(inp, []) if n.op_type == "QuantizeLinear" and len(n.input) == 3]
    if not first:
        return []
    own = _values(inits, (first[0].input[1], first[0].input[2]))
    frontier = [first[0]]
    while frontier:
        q = frontier.pop()
        key = (q.input[1], q.input[2])
        if _values(inits, key) != own or key in keys:
            continue
        keys.append(key)
        for dq in consumers.get(q.output[0], []):
            if dq.op_type != "DequantizeLinear":
                continue
            for op in consumers.get(dq.output[0], []):
                if op.op_type not in SCALE_PRESERVING or op.input[0] != dq.output[0]:
                    continue
                frontier += [n for n in consumers.get(op.output[0], []) if n.op_type == "QuantizeLinear"
                             and len(n.input) == 3]
    return keys


def _values(inits: dict[str, onnx.TensorProto], k: Key) -> tuple | None:
    if k[0] not in inits or k[1] not in inits:
        return None
    return tuple(numpy_helper.to_array(inits[n]).reshape(-1).tolist() for n in k)


def _same_type(inits: dict[str, onnx.TensorProto], a: Key, b: Key) -> bool:
    return a[1] in inits and b[1] in inits and inits[a[1]].data_type == inits[b[1]].data_type
