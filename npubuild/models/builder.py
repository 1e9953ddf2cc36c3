"""A small ONNX graph builder with seeded, well-scaled random weights.

Enough to write the MLPerf-Tiny style example networks in a few lines each;
weights are He-initialised so activations keep a sensible range through depth.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


class GraphBuilder:
    def __init__(self, name: str, seed: int = 0, opset: int = OPSET):
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._n = 0

    def _name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def input(self, name: str, shape: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name

    def output(self, value: str, shape: list[int | str] | None = None) -> None:
        self.outputs.append(helper.make_tensor_value_info(value, TensorProto.FLOAT, shape))

    def const(self, array: np.ndarray, hint: str = "c") -> str:
        name = self._name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, hint: str | None = None, **attrs) -> str | list[str]:
        name = self._name(hint or op.lower())
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs if n_out > 1 else outs[0]

    # ----------------------------------------------------------------- layers

    def conv(self, x: str, cin: int, cout: int, k: tuple[int, int], stride=(1, 1), pads=None, group: int = 1,
             bias: bool = True, dilation=(1, 1)) -> str:
        fan_in = (cin // group) * k[0] * k[1]
        w = self.rng.normal(0, np.sqrt(2.0 / fan_in), size=(cout, cin // group, *k)).astype(np.float32)
        ins = [x, self.const(w, "w")]
        if bias:
            ins.append(self.const(self.rng.normal(0, 0.05, size=cout).astype(np.float32), "b"))
        if pads is None:
            pads = [(k[0] - 1) // 2, (k[1] - 1) // 2, k[0] // 2, k[1] // 2]
        return self.node("Conv", ins, kernel_shape=list(k), strides=list(stride), pads=list(pads), group=group,
                         dilations=list(dilation))

    def conv1d(self, x: str, cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1, causal: bool = False,
               bias: bool = True) -> str:
        """Conv1d on [N, C, L]; `causal` pads (k - 1) * dilation on the left with an explicit Pad node, as torch
        writes a causal TCN layer (F.pad then an unpadded conv)."""
        if causal:
            x = self.node("Pad", [x, self.shape([0, 0, (k - 1) * dilation, 0, 0, 0])])
            pads = [0, 0]
        else:
            pads = [(k - 1) * dilation // 2, (k - 1) * dilation - (k - 1) * dilation // 2]
        w = self.rng.normal(0, np.sqrt(2.0 / (cin * k)), size=(cout, cin, k)).astype(np.float32)
        ins = [x, self.const(w, "w")]
        if bias:
            ins.append(self.const(self.rng.normal(0, 0.05, size=cout).astype(np.float32), "b"))
        return self.node("Conv", ins, kernel_shape=[k], strides=[stride], pads=pads, dilations=[dilation])

    def recurrent(self, op: str, x: str, cin: int, hidden: int, **attrs) -> tuple[str, str]:
        """One-direction GRU or LSTM on [T, N, C] (ONNX layout 0), torch-style uniform(+-1/sqrt(H)) weights;
        returns (Y, Y_h)."""
        gates = {"GRU": 3, "LSTM": 4}[op]
        bound = 1.0 / np.sqrt(hidden)
        w = self.rng.uniform(-bound, bound, (1, gates * hidden, cin)).astype(np.float32)
        r = self.rng.uniform(-bound, bound, (1, gates * hidden, hidden)).astype(np.float32)
        b = self.rng.uniform(-bound, bound, (1, 2 * gates * hidden)).astype(np.float32)
        ins = [x, self.const(w, f"{op.lower()}_W"), self.const(r, f"{op.lower()}_R"), self.const(b, f"{op.lower()}_B")]
        outs = self.node(op, ins, n_out=2, hidden_size=hidden, **attrs)
        return outs[0], outs[1]

    def batchnorm(self, x: str, c: int) -> str:
        gamma = self.rng.uniform(0.7, 1.3, c).astype(np.float32)
        beta = self.rng.normal(0, 0.1, c).astype(np.float32)
        mean = self.rng.normal(0, 0.1, c).astype(np.float32)
        var = self.rng.uniform(0.5, 1.5, c).astype(np.float32)
        return self.node("BatchNormalization", [x, *(self.const(a, "bn") for a in (gamma, beta, mean, var))],
                         epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.node("Relu", [x])

    def gemm(self, x: str, cin: int, cout: int) -> str:
        w = self.rng.normal(0, np.sqrt(1.0 / cin), size=(cout, cin)).astype(np.float32)
        b = self.rng.normal(0, 0.05, size=cout).astype(np.float32)
        return self.node("Gemm", [x, self.const(w, "fc_w"), self.const(b, "fc_b")], transB=1)

    def conv_bn(self, x: str, cin: int, cout: int, k: tuple[int, int], act: str | None = "Relu", **kw) -> str:
        """Conv (no bias, as exporters write it before a BatchNorm) + BatchNorm + optional activation."""
        y = self.batchnorm(self.conv(x, cin, cout, k, bias=False, **kw), cout)
        if act == "Relu6":
            return self.node("Clip", [y, self.const(np.float32(0.0), "lo"), self.const(np.float32(6.0), "hi")])
        return self.node(act, [y]) if act else y

    def linear(self, x: str, cin: int, cout: int) -> str:
        """x @ W + b with MatMul and Add, as exporters write a Linear on a rank-3 tensor."""
        w = self.rng.normal(0, np.sqrt(1.0 / cin), size=(cin, cout)).astype(np.float32)
        b = self.rng.normal(0, 0.05, size=cout).astype(np.float32)
        return self.node("Add", [self.node("MatMul", [x, self.const(w, "mm_w")]), self.const(b, "mm_b")])

    def layernorm(self, x: str, c: int) -> str:
        gamma = self.rng.uniform(0.8, 1.2, c).astype(np.float32)
        beta = self.rng.normal(0, 0.05, c).astype(np.float32)
        return self.node("LayerNormalization", [x, self.const(gamma, "ln_g"), self.const(beta, "ln_b")], axis=-1,
                         epsilon=1e-5)

    def shape(self, dims: list[int]) -> str:
        return self.const(np.asarray(dims, np.int64), "shape")

    def model(self, extra_opsets: dict[str, int] | None = None) -> onnx.ModelProto:
        """The model; `extra_opsets` imports the operator domains of custom nodes (domain -> version)."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        opsets = [helper.make_opsetid("", self.opset)]
        opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
        m = helper.make_model(graph, opset_imports=opsets, producer_name="npubuild.models")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m
