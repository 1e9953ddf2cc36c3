"""Unroll LSTM, GRU and RNN over their static sequence into standard ONNX ops, at import.

Why at import, before quantisation: onnxruntime's quantiser has no QDQ form for the recurrent ops (it
leaves them in float), so an int8 recurrent layer has no reference to be checked against, and a
lowering would have to invent the quantisation of every gate and state. Unrolled into MatMul, Add,
Split, Sigmoid/Tanh and Mul nodes, the layer is an ordinary graph: onnxruntime calibrates and quantises
every gate pre-activation, gate, cell state and hidden state like any other activation, the QDQ model
is the reference the TOSA check compares with, and the lowering needs nothing recurrent (FC convs, TABLE
for the activations, elementwise int8 ops). The float function is unchanged (the same products and
sums); only the node count grows with the sequence, so embedded models (tens of steps) fit.

How the state is quantised, then: each step's hidden state H_t (and LSTM cell state C_t) is an int8
tensor with its own per-tensor scale and zero point, calibrated by onnxruntime on the unrolled graph
(minmax over the calibration set). When the full sequence output Y is read, its Concat gives every H_t
the Concat's one scale (frontend/qdq_concat.py), the union of the steps' ranges. Each gate's
pre-activations (x W^T + h R^T + b, the gates of a step together) share one scale per step.
Measured on the KWS examples (configs/kws_recurrent.yaml, 25 steps, 48 units, 8 samples): the int8 TOSA
graph equals onnxruntime's QDQ model exactly (0 LSB) for both GRU and LSTM on U55 and U85; the QDQ model
against the float one is 33.3 dB (GRU) and 29.5 dB (LSTM: the int8 cell state is the coarsest step).

Per direction the unrolled form is: one MatMul of the whole sequence by W^T plus the biases that add
to it (hoisted out of the loop: one fully connected layer over all steps on the NPU), a Split into
steps, and per step one MatMul of the previous state by R^T, one Add, a Split into gates, the gate
activations and the state update (LSTM: C = f C' + i g, H = o h(C); GRU: H = n + z (H' - n); RNN:
H = f(...)). Zero initial states are constants, so the first step's recurrent product folds away.
Attributes: layout, direction (forward, reverse, bidirectional), activations with their alpha/beta,
clip, hidden_size, linear_before_reset (GRU), input_forget and peepholes (LSTM), initial states, and
sequence_lens when it is a constant equal for every batch entry (steps past it give zeros in Y, as ONNX
says). Anything else (unequal or run-time sequence lengths, non-constant weights) is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register
from npubuild.frontend.passes._rewrite import replace_value

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
ALPHA = {"LeakyRelu": 0.01, "ThresholdedRelu": 1.0, "ScaledTanh": 1.0, "HardSigmoid": 0.2, "Elu": 1.0, "Affine": 1.0}
BETA = {"ScaledTanh": 1.0, "HardSigmoid": 0.5, "Affine": 0.0}


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _input(node: ir.Node, i: int) -> ir.Value | None:
    return node.inputs[i] if i < len(node.inputs) else None


class _Builder:
    """Appends nodes before `anchor` (so the graph stays in topological order) and registers initializers."""

    def __init__(self, graph: ir.Graph, anchor: ir.Node, prefix: str):
        self.graph, self.anchor, self.prefix, self.n = graph, anchor, prefix, 0

    def _name(self, hint: str) -> str:
        self.n += 1
        return f"{self.prefix}/{hint}_{self.n}"

    def op(self, op_type: str, inputs: list[ir.Value | None], n_out: int = 1, **attrs) -> ir.Value | list[ir.Value]:
        outs = [ir.Value(name=self._name(f"{op_type.lower()}_out")) for _ in range(n_out)]
        node = ir.node(op_type, inputs, attrs, outputs=outs, name=self._name(op_type))
        self.graph.insert_before(self.anchor, [node])
        return outs if n_out > 1 else outs[0]

    def const(self, arr: np.ndarray, hint: str) -> ir.Value:
        arr = np.ascontiguousarray(arr)
        name = self._name(hint)
        v = ir.Value(name=name, const_value=ir.tensor(arr, name=name), shape=ir.Shape(arr.shape),
                     type=ir.TensorType(ir.DataType.from_numpy(arr.dtype)))
        self.graph.register_initializer(v)
        return v

    def ints(self, values: list[int], hint: str = "ints") -> ir.Value:
        return self.const(np.asarray(values, np.int64), hint)

    def split(self, x: ir.Value, axis: int, sizes: list[int]) -> list[ir.Value]:
        if len(sizes) == 1:
            return [x]
        outs = self.op("Split", [x, self.ints(sizes, "split")], n_out=len(sizes), axis=axis)
        return outs if isinstance(outs, list) else [outs]

    def squeeze0(self, x: ir.Value) -> ir.Value:
        return self.op("Squeeze", [x, self.ints([0], "axes")])

    def unsqueeze(self, x: ir.Value, axis: int) -> ir.Value:
        return self.op("Unsqueeze", [x, self.ints([axis], "axes")])


@dataclass(frozen=True)
class Activation:
    op: str
    alpha: float | None
    beta: float | None

    def apply(self, b: _Builder, x: ir.Value) -> ir.Value:
        f32 = np.float32
        if self.op in ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"):
            return b.op(self.op, [x])
        if self.op == "LeakyRelu":
            return b.op("LeakyRelu", [x], alpha=self.alpha)
        if self.op == "ThresholdedRelu":
            return b.op("ThresholdedRelu", [x], alpha=self.alpha)
        if self.op == "Elu":
            return b.op("Elu", [x], alpha=self.alpha)
        if self.op == "HardSigmoid":
            return b.op("HardSigmoid", [x], alpha=self.alpha, beta=self.beta)
        if self.op == "Affine":
            return b.op("Add", [b.op("Mul", [x, b.const(f32(self.alpha), "alpha")]), b.const(f32(self.beta), "beta")])
        assert self.op == "ScaledTanh"
        return b.op("Mul", [b.op("Tanh", [b.op("Mul", [x, b.const(f32(self.beta), "beta")])]),
                            b.const(f32(self.alpha), "alpha")])


KNOWN_ACTIVATIONS = {"Sigmoid", "Tanh", "Relu", "Softsign", "Softplus", "LeakyRelu", "ThresholdedRelu", "Elu",
                     "HardSigmoid", "Affine", "ScaledTanh"}


def _activations(node: ir.Node, directions: int) -> list[list[Activation]] | None:
    names = node.attributes.get_strings("activations", None)
    per_dir = len(DEFAULT_ACTIVATIONS[node.op_type])
    names = list(names) if names else DEFAULT_ACTIVATIONS[node.op_type] * directions
    if len(names) == per_dir and directions == 2:
        names = names * 2
    if len(names) != per_dir * directions:
        return None
    alphas = list(node.attributes.get_floats("activation_alpha", []))
    betas = list(node.attributes.get_floats("activation_beta", []))
    acts = []
    for name in names:
        canon = next((k for k in KNOWN_ACTIVATIONS if k.lower() == name.lower()), None)
        if canon is None:
            return None
        alpha = alphas.pop(0) if canon in ALPHA and alphas else ALPHA.get(canon)
        beta = betas.pop(0) if canon in BETA and betas else BETA.get(canon)
        acts.append(Activation(canon, alpha, beta))
    return [acts[d * per_dir:(d + 1) * per_dir] for d in range(directions)]


@dataclass
class Layer:
    """One recurrent node's static description."""

    op: str
    steps: int  # steps run (a constant sequence_lens may cut the sequence)
    total: int  # sequence length of X
    batch: int
    hidden: int
    directions: int
    reverse_only: bool
    w: np.ndarray  # [D, G H, I]
    r: np.ndarray  # [D, G H, H]
    bias: np.ndarray  # [D, 2 G H]
    peep: np.ndarray | None  # [D, 3 H] (LSTM)
    acts: list[list[Activation]]
    clip: float | None
    linear_before_reset: bool
    input_forget: bool
    layout: int


def _describe(node: ir.Node) -> Layer | None:
    """The layer, or None when it cannot be unrolled statically (it is then left for the host)."""
    x = node.inputs[0]
    w, r = _const(_input(node, 1)), _const(_input(node, 2))
    if x is None or x.shape is None or w is None or r is None or not all(isinstance(d, int) for d in x.shape):
        return None
    layout = node.attributes.get_int("layout", 0)
    total, batch = (x.shape[0], x.shape[1]) if layout == 0 else (x.shape[1], x.shape[0])
    gates = GATES[node.op_type]
    hidden = node.attributes.get_int("hidden_size", r.shape[-1])
    direction = node.attributes.get_string("direction", "forward")
    directions = 2 if direction == "bidirectional" else 1
    if w.shape[0] != directions or w.shape[1] != gates * hidden or r.shape[1:] != (gates * hidden, hidden):
        return None
    b = _const(_input(node, 3))
    if _input(node, 3) is not None and b is None:
        return None
    bias = np.zeros((directions, 2 * gates * hidden), np.float32) if b is None else b.astype(np.float32)
    steps = total
    lens_v = _input(node, 4)
    if lens_v is not None:
        lens = _const(lens_v)
        if lens is None or lens.size != batch or np.any(lens != lens.reshape(-1)[0]):
            return None
        steps = int(lens.reshape(-1)[0])
        if not 0 < steps <= total:
            return None
    peep = None
    if node.op_type == "LSTM" and _input(node, 7) is not None:
        peep = _const(_input(node, 7))
        if peep is None:
            return None
    acts = _activations(node, directions)
    if acts is None:
        return None
    clip = node.attributes.get_float("clip", None) if "clip" in node.attributes else None
    return Layer(node.op_type, steps, total, batch, hidden, directions, direction == "reverse",
                 w.astype(np.float32), r.astype(np.float32), bias, None if peep is None else peep.astype(np.float32),
                 acts, clip, bool(node.attributes.get_int("linear_before_reset", 0)),
                 bool(node.attributes.get_int("input_forget", 0)), layout)


def _state(b: _Builder, node: ir.Node, index: int, layer: Layer, d: int) -> ir.Value | None:
    """Initial state `index` (5: initial_h, 6: initial_c) of direction d as [B, H]; None (zeros) if absent."""
    v = _input(node, index)
    if v is None:
        return None
    if layer.layout == 1:  # [B, D, H]
        v = b.op("Transpose", [v], perm=[1, 0, 2])
    parts = b.split(v, 0, [1] * layer.directions)
    return b.squeeze0(parts[d])


def _gate_block(b: _Builder, layer: Layer, h: ir.Value, r_t: np.ndarray, bias: np.ndarray | None) -> ir.Value:
    """h R^T (+ bias), as a constant-weight MatMul (an FC layer on the NPU)."""
    y = b.op("MatMul", [h, b.const(np.ascontiguousarray(r_t), "R_T")])
    return y if bias is None else b.op("Add", [y, b.const(bias, "Rb")])


def _plus_recurrent(b: _Builder, layer: Layer, xt: ir.Value, h: ir.Value | None, r_t: np.ndarray) -> ir.Value:
    """x_t W^T + b + h R^T; just the first term for a zero state (no product of zeros to quantise)."""
    return xt if h is None else b.op("Add", [xt, _gate_block(b, layer, h, r_t, None)])


def _clip(b: _Builder, layer: Layer, x: ir.Value) -> ir.Value:
    if layer.clip is None:
        return x
    c = np.float32(layer.clip)
    return b.op("Clip", [x, b.const(-c, "clip_lo"), b.const(c, "clip_hi")])


def _direction(b: _Builder, node: ir.Node, layer: Layer, x_seq: ir.Value, d: int
               ) -> tuple[list[ir.Value], ir.Value, ir.Value | None]:
    """Unroll direction d; returns (H_t for t = 0..steps-1 in sequence order, last H, last C)."""
    g, hsz = GATES[layer.op], layer.hidden
    w, r, bias = layer.w[d], layer.r[d], layer.bias[d]
    wb, rb = bias[:g * hsz], bias[g * hsz:]
    acts = layer.acts[d]
    if layer.op == "GRU":  # the h gate's recurrent bias stays with the recurrent product (linear_before_reset)
        x_bias = wb + np.concatenate([rb[:2 * hsz], np.zeros(hsz, np.float32)])
    else:
        x_bias = wb + rb
    xw = b.op("Add", [b.op("MatMul", [x_seq, b.const(np.ascontiguousarray(w.T), "W_T")]), b.const(x_bias, "Wb")])
    per_step = b.split(xw, 0, [1] * layer.total)[:layer.steps]
    order = range(layer.steps - 1, -1, -1) if (d == 1 or layer.reverse_only) else range(layer.steps)
    h = _state(b, node, 5, layer, d)
    c = _state(b, node, 6, layer, d) if layer.op == "LSTM" else None
    outs: dict[int, ir.Value] = {}
    for t in order:
        xt = b.squeeze0(per_step[t])
        if layer.op == "LSTM":
            h, c = _lstm_step(b, layer, d, xt, h, c, r, acts)
        elif layer.op == "GRU":
            h = _gru_step(b, layer, xt, h, r, rb, acts)
        else:
            h = acts[0].apply(b, _clip(b, layer, _plus_recurrent(b, layer, xt, h, r.T)))
        outs[t] = h
    return [outs[t] for t in range(layer.steps)], h, c


def _lstm_step(b: _Builder, layer: Layer, d: int, xt: ir.Value, h: ir.Value | None, c: ir.Value | None,
               r: np.ndarray, acts: list[Activation]) -> tuple[ir.Value, ir.Value]:
    """ONNX gate order i, o, f, c: C = f C' + i g(.), H = o h(C), peepholes P = [Pi, Po, Pf]."""
    hsz = layer.hidden
    f_act, g_act, h_act = acts
    pre = _clip(b, layer, _plus_recurrent(b, layer, xt, h, r.T))
    gi, go, gf, gc = b.split(pre, 1, [hsz] * 4)
    peep = layer.peep[d] if layer.peep is not None else None
    if peep is not None and c is not None:
        gi = b.op("Add", [gi, b.op("Mul", [c, b.const(peep[:hsz], "Pi")])])
        gf = b.op("Add", [gf, b.op("Mul", [c, b.const(peep[2 * hsz:], "Pf")])])
    i = f_act.apply(b, gi)
    ig = b.op("Mul", [i, g_act.apply(b, gc)])
    if c is None:  # a zero cell state: f C' is zero
        c_new = ig
    else:
        f = b.op("Sub", [b.const(np.float32(1.0), "one"), i]) if layer.input_forget else f_act.apply(b, gf)
        c_new = b.op("Add", [b.op("Mul", [f, c]), ig])
    if peep is not None:
        go = b.op("Add", [go, b.op("Mul", [c_new, b.const(peep[hsz:2 * hsz], "Po")])])
    o = f_act.apply(b, go)
    return b.op("Mul", [o, h_act.apply(b, c_new)]), c_new


def _gru_step(b: _Builder, layer: Layer, xt: ir.Value, h: ir.Value | None, r: np.ndarray, rb: np.ndarray,
              acts: list[Activation]) -> ir.Value:
    """ONNX gate order z, r, h: H = n + z (H' - n), which is (1 - z) n + z H' with one product.

    With a zero H' (no initial state, first step) the recurrent products are constants: the z, r
    pre-activations are x's alone, the reset term r * Rbh (linear_before_reset) or Rbh, and H = n - z n."""
    hsz = layer.hidden
    f_act, g_act = acts
    xz_r, xn = b.split(xt, 1, [2 * hsz, hsz])
    rbh = rb[2 * hsz:]
    if h is None:
        zr = f_act.apply(b, _clip(b, layer, xz_r))
        z, rg = b.split(zr, 1, [hsz, hsz])
        reset = b.op("Mul", [rg, b.const(rbh, "Rbh")]) if layer.linear_before_reset else b.const(rbh, "Rbh")
        n = g_act.apply(b, _clip(b, layer, b.op("Add", [xn, reset])))
        return b.op("Sub", [n, b.op("Mul", [z, n])])
    if layer.linear_before_reset:
        hr = _gate_block(b, layer, h, r.T, np.concatenate([np.zeros(2 * hsz, np.float32), rbh]))
        hzr, hn = b.split(hr, 1, [2 * hsz, hsz])
    else:
        hzr = _gate_block(b, layer, h, r[:2 * hsz].T, None)
    zr = f_act.apply(b, _clip(b, layer, b.op("Add", [xz_r, hzr])))
    z, rg = b.split(zr, 1, [hsz, hsz])
    if layer.linear_before_reset:
        reset = b.op("Mul", [rg, hn])
    else:
        reset = _gate_block(b, layer, b.op("Mul", [rg, h]), r[2 * hsz:].T, rbh)
    n = g_act.apply(b, _clip(b, layer, b.op("Add", [xn, reset])))
    return b.op("Add", [n, b.op("Mul", [z, b.op("Sub", [h, n])])])


def unroll(graph: ir.Graph, node: ir.Node, layer: Layer) -> None:
    b = _Builder(graph, node, node.name or node.op_type)
    x = node.inputs[0]
    x_seq = b.op("Transpose", [x], perm=[1, 0, 2]) if layer.layout == 1 else x
    results = [_direction(b, node, layer, x_seq, d) for d in range(layer.directions)]
    y, y_h, y_c = (node.outputs[i] if i < len(node.outputs) else None for i in range(3))
    if y is not None and (y.uses() or y.is_graph_output()):
        per_dir = []
        pad = b.const(np.zeros((layer.total - layer.steps, layer.batch, layer.hidden), np.float32), "pad")
        for hs, _, _ in results:
            seq = b.op("Concat", [b.unsqueeze(h, 0) for h in hs] + ([pad] if layer.steps < layer.total else []),
                       axis=0)
            per_dir.append(b.unsqueeze(seq, 1))  # [T, 1, B, H]
        full = per_dir[0] if len(per_dir) == 1 else b.op("Concat", per_dir, axis=1)
        replace_value(y, b.op("Transpose", [full], perm=[2, 0, 1, 3]) if layer.layout == 1 else full)
    for k, out in ((1, y_h), (2, y_c)):
        if out is None or not (out.uses() or out.is_graph_output()):
            continue
        lasts = [b.unsqueeze(res[k], 0) for res in results]  # [1, B, H] each
        last = lasts[0] if len(lasts) == 1 else b.op("Concat", lasts, axis=0)
        replace_value(out, b.op("Transpose", [last], perm=[1, 0, 2]) if layer.layout == 1 else last)
    graph.remove(node, safe=True)


@register("unroll_recurrent")
class UnrollRecurrent(ir.passes.InPlacePass):
    """Replace every statically shaped LSTM/GRU/RNN by its unrolled form (see the module docstring)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type not in GATES or node.domain not in ("", "ai.onnx"):
                continue
            layer = _describe(node)
            if layer is None:
                continue
            unroll(model.graph, node, layer)
            modified = True
        return ir.passes.PassResult(model, modified)
