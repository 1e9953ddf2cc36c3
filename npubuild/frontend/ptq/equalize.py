"""Cross-layer equalisation (Nagel et al. 2019, section 4.1) with the scale chosen SmoothQuant's way (Xiao et
al. 2023, alpha 0.5): between two convolutions with only a positively homogeneous activation between them
(none, Relu, PRelu, LeakyRelu), channel i of the tensor between is divided by s_i, the first layer's output
channel i (weights and bias) likewise, and the second layer's input channel i multiplied by it: the float
function is unchanged. With per-channel weights the first layer's rounding is unchanged too, so the
scale is free to equalise what is quantised per tensor: the activation between, whose channels can differ
by 100x in range (MobileNet-style depthwise-separable blocks), against the second layer's weights
(s_i = sqrt(activation range_i / weight range_i): both end at their geometric mean; a depthwise second
layer quantises each channel on its own and takes any scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.frontend.ptq.session import session_options
from npubuild.frontend.ptq.stats import exposing

HOMOGENEOUS = {"Relu", "PRelu", "LeakyRelu"}  # f(s x) = s f(x) for s > 0, per channel
SCALE_BOUNDS = (1e-3, 1e3)


@dataclass
class Pair:
    first: onnx.NodeProto
    second: onnx.NodeProto
    between: str  # the tensor the second layer reads (the activation's output, or the first layer's)
    depthwise_second: bool


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def pairs(model: onnx.ModelProto) -> list[Pair]:
    """Conv -> [homogeneous activation] -> Conv chains whose tensors have one reader each and whose weights
    and biases are initializers of their own."""
    inits = {t.name: t for t in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in model.graph.output}
    prod = {o: n for n in model.graph.node for o in n.output}

    def own(name: str) -> bool:
        return name in inits and len(readers.get(name, [])) == 1

    found = []
    for second in model.graph.node:
        if second.op_type != "Conv" or not own(second.input[1]):
            continue
        between = second.input[0]
        first = prod.get(between)
        if first is not None and first.op_type in HOMOGENEOUS:
            if len(first.input) > 1 and first.input[1] not in inits:
                continue
            act_in = first.input[0]
            if len(readers.get(act_in, [])) != 1 or act_in in outputs:
                continue
            first = prod.get(act_in)
        if first is None or first.op_type != "Conv" or not own(first.input[1]):
            continue
        if len(first.input) > 2 and first.input[2] and not own(first.input[2]):
            continue
        if len(readers.get(between, [])) != 1 or between in outputs or first.output[0] in outputs:
            continue
        w2 = inits[second.input[1]]
        c = inits[first.input[1]].dims[0]
        group = _attr(second, "group", 1)
        depthwise = group == c and w2.dims[0] == c and w2.dims[1] == 1
        if group != 1 and not depthwise:
            continue
        if not depthwise and w2.dims[1] != c:
            continue
        found.append(Pair(first, second, between, depthwise))
    return found


def channel_ranges(model: onnx.ModelProto, names: list[str], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """max |x| per channel (axis 1) of each tensor over the calibration samples."""
    import onnxruntime as ort

    session = ort.InferenceSession(exposing(model, names), session_options(), providers=["CPUExecutionProvider"])
    feeds_names = {i.name for i in session.get_inputs()}
    out: dict[str, np.ndarray] = {}
    for i in range(next(iter(arrays.values())).shape[0]):
        for name, v in zip(names, session.run(names, {k: np.asarray(v[i]) for k, v in arrays.items()
                                                      if k in feeds_names}), strict=True):
            m = np.abs(np.moveaxis(np.asarray(v, np.float64), 1, 0)).reshape(v.shape[1], -1).max(axis=1)
            out[name] = m if name not in out else np.maximum(out[name], m)
    return out


def equalise(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, int]:
    """A copy of the float model with every equalisable pair rescaled, and how many pairs were."""
    found = pairs(model)
    if not found:
        return model, 0
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    act = channel_ranges(model, [p.between for p in found], arrays)
    done = 0
    for p in found:
        w1 = numpy_helper.to_array(inits[p.first.input[1]]).astype(np.float64)
        w2 = numpy_helper.to_array(inits[p.second.input[1]]).astype(np.float64)
        a = act[p.between]
        w2_range = np.abs(w2).reshape(w2.shape[0], -1).max(axis=1) if p.depthwise_second else \
            np.abs(np.moveaxis(w2, 1, 0)).reshape(w2.shape[1], -1).max(axis=1)
        if a.shape != w2_range.shape or a.shape[0] != w1.shape[0]:
            continue
        ok = (a > 0) & (w2_range > 0)
        s = np.ones_like(a)
        s[ok] = np.sqrt(a[ok] / w2_range[ok])
        s[ok] /= np.exp(np.mean(np.log(s[ok])))  # keep the tensor's overall scale where it was
        s = np.clip(s, *SCALE_BOUNDS)
        shape1 = (-1,) + (1,) * (w1.ndim - 1)
        _set(inits[p.first.input[1]], w1 / s.reshape(shape1))
        if len(p.first.input) > 2 and p.first.input[2]:
            _set(inits[p.first.input[2]], numpy_helper.to_array(inits[p.first.input[2]]) / s)
        if p.depthwise_second:
            _set(inits[p.second.input[1]], w2 * s.reshape(shape1))
        else:
            _set(inits[p.second.input[1]], w2 * s.reshape((1, -1) + (1,) * (w2.ndim - 2)))
        done += 1
    return out, done


def _set(tensor: onnx.TensorProto, value: np.ndarray) -> None:
    tensor.CopyFrom(numpy_helper.from_array(value.astype(np.float32), tensor.name))
