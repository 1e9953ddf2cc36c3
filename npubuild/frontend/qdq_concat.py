"""QDQ post-pass: every Concat's inputs share the Concat output's quantisation, as TFLite's quantiser does.

onnxruntime calibrates a Concat's output on its own, so each input reaches it
with another scale and the lowering must requantise it: Vela runs that as a
standalone RESCALE (or copy) over the whole tensor. Giving the inputs, the
output and the data-movement ops between them (Resize, MaxPool, Reshape...,
which keep their input's parameters) one set of parameters, the union of their
calibrated ranges, moves the requantisation into the producers' own output
RESCALE, where it is free, and lets Vela write each input straight into the
Concat's output. Only activations quantised per tensor take part.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

# ops whose int8 output onnxruntime quantises with their input's parameters (values are only moved)
SCALE_PRESERVING = frozenset({"Resize", "MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
                              "Identity", "Slice", "Gather", "DepthToSpace", "SpaceToDepth"})

Key = tuple[str, str]  # (scale initializer, zero-point initializer)
# a value-moving op's input read elsewhere too keeps its own grid when the Concat's is this much coarser (2 bits)
KEEP_APART_RANGE = 4.0


class _Groups:
    """Union-find over quantisation-parameter keys."""

    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}

    def find(self, k: Key) -> Key:
        self.parent.setdefault(k, k)
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: Key, b: Key) -> None:
        self.parent[self.find(a)] = self.find(b)

    def groups(self) -> list[list[Key]]:
        out: dict[Key, list[Key]] = {}
        for k in self.parent:
            out.setdefault(self.find(k), []).append(k)
        return [g for g in out.values() if len(g) > 1]


def _key(node: onnx.NodeProto) -> Key | None:
    return (node.input[1], node.input[2]) if len(node.input) == 3 and node.input[2] else None


def _activation_keys(model: onnx.ModelProto) -> tuple[dict[str, Key], dict[str, Key]]:
    """Per tensor: the key of the DequantizeLinear producing it, and of the QuantizeLinear consuming it."""
    dq_of, q_of = {}, {}
    for n in model.graph.node:
        k = _key(n)
        if k is None:
            continue
        if n.op_type == "DequantizeLinear":
            dq_of[n.output[0]] = k
        elif n.op_type == "QuantizeLinear":
            q_of[n.input[0]] = k
    return dq_of, q_of


def _link(model: onnx.ModelProto, inits: dict[str, onnx.TensorProto],
          apart: frozenset[str] = frozenset()) -> tuple[_Groups, list[tuple[Key, Key, str]]]:
    """The groups of keys that share one set of parameters, without the value-moving ops whose output is in
    `apart`; and every value-moving link whose input other nodes read too: (input key, output key, output)."""
    dq_of, q_of = _activation_keys(model)
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    g = _Groups()
    shared_inputs = []
    for n in model.graph.node:
        out = q_of.get(n.output[0]) if n.output else None
        if out is None or not _scalar_int8(inits, out):
            continue
        if n.op_type == "Concat":
            ins = [dq_of.get(i) for i in n.input if i]
            if all(k is not None and _scalar_int8(inits, k) for k in ins):
                for k in ins:
                    g.union(k, out)
        elif n.op_type in SCALE_PRESERVING and n.input and (k := dq_of.get(n.input[0])) is not None \
                and _values(inits, k) == _values(inits, out):
            if readers.get(n.input[0], 0) > 1:
                shared_inputs.append((k, out, n.output[0]))
            if n.output[0] not in apart:
                g.union(k, out)
    return g, shared_inputs


def _kept_apart(model: onnx.ModelProto, inits: dict[str, onnx.TensorProto], symmetric: bool) -> frozenset[str]:
    """The outputs of value-moving ops into a Concat group whose input other nodes read too and whose own
    range is more than KEEP_APART_RANGE times narrower than the group's union: sharing would coarsen what
    those readers see (Silero VAD's LSTM h, read by its decoder and stacked with the ~28x wider cell state
    c: 0.5 dB lost at the decoder's input, 0.3 dB at the VAD output). That op requantises instead (a RESCALE
    of that input only)."""
    groups, shared_inputs = _link(model, inits)
    union = {}
    for group in groups.groups():
        scale, _ = union_params([_values(inits, k) for k in group], symmetric)
        union.update(dict.fromkeys(group, scale))
    return frozenset(name for k, out, name in shared_inputs
                     if out in union and union[out] > KEEP_APART_RANGE * _values(inits, k)[0])


def _own_parameters(model: onnx.ModelProto, inits: dict[str, onnx.TensorProto], tensor: str) -> None:
    """Give `tensor`'s QuantizeLinear and its DequantizeLinears their own copies of the parameters they share
    with the tensor they were moved from (onnxruntime names a value-moving op's output on its input's)."""
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor)
    names = []
    for old, suffix in zip(q.input[1:3], ("scale", "zero_point"), strict=True):
        name, i = f"{tensor}_{suffix}", 0
        while name in inits:
            i += 1
            name = f"{tensor}_{suffix}_{i}"
        copy = numpy_helper.from_array(numpy_helper.to_array(inits[old]).copy(), name)
        model.graph.initializer.append(copy)
        inits[name] = model.graph.initializer[-1]
        names.append(name)
    for n in model.graph.node:
        if n is q or n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]:
            n.input[1], n.input[2] = names


def _scalar_int8(inits: dict[str, onnx.TensorProto], k: Key) -> bool:
    s, z = inits.get(k[0]), inits.get(k[1])
    return s is not None and z is not None and z.data_type == onnx.TensorProto.INT8 \
        and numpy_helper.to_array(s).size == 1 and numpy_helper.to_array(z).size == 1


def _values(inits: dict[str, onnx.TensorProto], k: Key) -> tuple[float, int]:
    return (float(numpy_helper.to_array(inits[k[0]]).reshape(-1)[0]),
            int(numpy_helper.to_array(inits[k[1]]).reshape(-1)[0]))


def union_params(params: list[tuple[float, int]], symmetric: bool) -> tuple[float, int]:
    """Int8 (scale, zero point) covering every member's real range, computed as onnxruntime computes one."""
    if symmetric:  # every member is [-128 s, 127 s]: the largest scale covers them all
        return max(s for s, _ in params), 0
    lo = min(s * (-128 - z) for s, z in params)
    hi = max(s * (127 - z) for s, z in params)
    scale = (hi - lo) / 255.0
    return scale, int(np.clip(np.round(-128 - lo / scale), -128, 127))


def share_concat_scales(model: onnx.ModelProto, symmetric: bool = False) -> int:
    """Rewrite (in place) the parameters of each Concat group to their union; returns how many keys changed."""
    inits = {t.name: t for t in model.graph.initializer}
    changed = 0
    apart = _kept_apart(model, inits, symmetric)
    for tensor in apart:
        _own_parameters(model, inits, tensor)
    groups, _ = _link(model, inits, apart)
    for group in groups.groups():
        params = [_values(inits, k) for k in group]
        scale, zp = union_params(params, symmetric)
        for k, (s, z) in zip(group, params, strict=True):
            if np.isclose(s, scale, rtol=1e-7, atol=0) and z == zp:
                continue
            for name, value in ((k[0], np.float32(scale)), (k[1], np.int8(zp))):
                old = numpy_helper.to_array(inits[name])
                inits[name].CopyFrom(numpy_helper.from_array(np.full(old.shape, value, old.dtype), name))
            changed += 1
    return changed
