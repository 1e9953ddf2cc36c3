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


def _link(model: onnx.ModelProto, inits: dict[str, onnx.TensorProto]) -> _Groups:
    dq_of, q_of = _activation_keys(model)
    g = _Groups()
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
            g.union(k, out)
    return g


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
    for group in _link(model, inits).groups():
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
