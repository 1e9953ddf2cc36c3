"""The examples npubuild builds itself (npubuild.models.zoo), as torch modules with the very same weights.

A benchmark helper, not part of npubuild. ExecuTorch's Arm backend takes torch modules; for the examples that
have no torch twin, this runs the ONNX graph node by node with the torch calls a torch user would write
(F.conv2d after an explicit F.pad for ONNX's asymmetric pads, F.batch_norm in eval, F.linear for Gemm and for a
constant-weight MatMul followed by its bias Add, F.interpolate for Resize), so torch.export sees an ordinary
aten graph. Only the op types the examples use are known; anything else raises.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


class OnnxAsTorch(torch.nn.Module):
    """Evaluates a float ONNX model's graph with torch ops; initializers become buffers."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__()
        self.graph = model.graph
        # float initializers are parameters (as a torch user's weights are: the PT2E quantizer folds
        # BatchNorm into a conv's weight *parameter*); integer ones (shapes) stay numpy
        self.attr: dict[str, str] = {}
        self.arrays: dict[str, np.ndarray] = {}  # every initializer's value, for attributes read while tracing
        for i, init in enumerate(model.graph.initializer):
            arr = np.array(numpy_helper.to_array(init))
            self.arrays[init.name] = arr
            if arr.dtype.kind == "f":
                self.register_parameter(f"c{i}", torch.nn.Parameter(torch.from_numpy(arr), requires_grad=False))
                self.attr[init.name] = f"c{i}"
        readers: dict[str, int] = {}
        for n in self.graph.node:
            for name in n.input:
                readers[name] = readers.get(name, 0) + 1
        self.readers = readers

    def _c(self, name: str) -> torch.Tensor:
        return getattr(self, self.attr[name])

    def _is_const(self, name: str) -> bool:
        return name in self.arrays

    def _np(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env: dict[str, torch.Tensor] = {self.graph.input[0].name: x}
        nodes = list(self.graph.node)
        skip: set[int] = set()
        for i, n in enumerate(nodes):
            if i in skip:
                continue
            a = _attrs(n)
            ins = [env.get(name) for name in n.input]
            op = n.op_type
            if op == "MatMul" and self._is_const(n.input[1]):
                bias = None
                nxt = nodes[i + 1] if i + 1 < len(nodes) else None
                if (nxt is not None and nxt.op_type == "Add" and nxt.input[0] == n.output[0]
                        and self._is_const(nxt.input[1]) and self.readers.get(n.output[0]) == 1):
                    bias, skip, out_name = self._c(nxt.input[1]), skip | {i + 1}, nxt.output[0]
                else:
                    out_name = n.output[0]
                env[out_name] = F.linear(ins[0], self._c(n.input[1]).T, bias)
                continue
            env[n.output[0]] = self._node(op, n, a, ins)
        return env[self.graph.output[0].name]

    def _node(self, op: str, n: onnx.NodeProto, a: dict, ins: list) -> torch.Tensor:  # noqa: C901 - one op table
        x = ins[0]
        if op == "Conv":
            pads = list(a.get("pads", [0, 0, 0, 0]))
            t, left, b, r = pads[0], pads[1], pads[2], pads[3]
            bias = self._c(n.input[2]) if len(n.input) > 2 and n.input[2] else None
            if t == b and left == r:
                return F.conv2d(x, self._c(n.input[1]), bias, tuple(a.get("strides", [1, 1])), (t, left),
                                groups=a.get("group", 1))
            return F.conv2d(F.pad(x, (left, r, t, b)), self._c(n.input[1]), bias, tuple(a.get("strides", [1, 1])),
                            groups=a.get("group", 1))
        if op == "BatchNormalization":
            g, beta, mean, var = (self._c(name) for name in n.input[1:5])
            return F.batch_norm(x, mean, var, g, beta, training=False, eps=a.get("epsilon", 1e-5))
        if op == "Gemm":
            w = self._c(n.input[1])
            w = w if a.get("transB", 0) else w.T
            return F.linear(x, w, self._c(n.input[2]) if len(n.input) > 2 else None)
        if op == "Relu":
            return F.relu(x)
        if op == "Clip":
            # torch.clamp, not F.relu6: ExecuTorch 1.5.1 leaves relu6's aten.hardtanh after a conv + BatchNorm on
            # the CPU (all 27 of MobileNetV1's, 28 NPU partitions), clamp it delegates (measured, bench/routes.md)
            return torch.clamp(x, float(self._np(n.input[1])), float(self._np(n.input[2])))
        if op == "HardSwish":
            return F.hardswish(x)
        if op == "HardSigmoid":
            if abs(a.get("alpha", 0.2) - 1 / 6) > 1e-6 or a.get("beta", 0.5) != 0.5:
                raise NotImplementedError("HardSigmoid other than torch's")
            return F.hardsigmoid(x)
        if op == "GlobalAveragePool":
            return F.adaptive_avg_pool2d(x, 1)
        if op == "AveragePool":
            return F.avg_pool2d(x, a["kernel_shape"], a.get("strides", a["kernel_shape"]))
        if op == "MaxPool":
            if any(a.get("pads", [0])):
                raise NotImplementedError("padded MaxPool")
            return F.max_pool2d(x, a["kernel_shape"], a.get("strides", a["kernel_shape"]))
        if op == "Flatten":
            return torch.flatten(x, a.get("axis", 1))
        if op == "Softmax":
            return torch.softmax(x, a.get("axis", -1))
        if op in ("Add", "Mul"):
            y = ins[1] if ins[1] is not None else self._c(n.input[1])
            return x + y if op == "Add" else x * y
        if op == "Concat":
            return torch.cat(ins, a["axis"])
        if op == "Resize":
            mode = a.get("mode", b"nearest").decode()
            if mode == "nearest":
                return F.interpolate(x, scale_factor=2.0, mode="nearest")
            return F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        if op == "Reshape":
            return x.reshape([int(d) for d in self._np(n.input[1])])
        if op == "Transpose":
            return x.permute(list(a["perm"]))
        if op == "MatMul":
            return torch.matmul(x, ins[1])
        if op == "LayerNormalization":
            g = self._c(n.input[1])
            return F.layer_norm(x, g.shape, g, self._c(n.input[2]), eps=a.get("epsilon", 1e-5))
        if op == "Gelu":
            return F.gelu(x)
        raise NotImplementedError(f"{op} ({n.name})")


# the op types _node (and forward's MatMul) knows; Conv and pools are the 2-D ones only
KNOWN = {"Conv", "BatchNormalization", "Gemm", "Relu", "Clip", "HardSwish", "HardSigmoid", "GlobalAveragePool",
         "AveragePool", "MaxPool", "Flatten", "Softmax", "Add", "Mul", "Concat", "Resize", "Reshape", "Transpose",
         "MatMul", "LayerNormalization", "Gelu"}


def unsupported(m: onnx.ModelProto) -> list[str]:
    """What of the graph has no torch twin here, named up front (a 1-D Conv used to fail as an IndexError)."""
    out = sorted({n.op_type for n in m.graph.node if n.op_type not in KNOWN})
    if any(n.op_type == "Conv" and len(_attrs(n).get("kernel_shape", [1, 1])) != 2 for n in m.graph.node):
        out.append("1-D Conv")
    return out


def torch_module(onnx_path: str) -> tuple[torch.nn.Module, torch.Tensor]:
    """The module and an example input (batch 1) for an example's float ONNX file."""
    m = onnx.load(onnx_path)
    if missing := unsupported(m):
        raise NotImplementedError(f"no torch twin in bench/onnx_as_torch.py for {', '.join(missing)}")
    dims = [d.dim_value if d.HasField("dim_value") else 1 for d in m.graph.input[0].type.tensor_type.shape.dim]
    return OnnxAsTorch(m).eval(), torch.zeros(dims)
