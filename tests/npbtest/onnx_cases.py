"""Invalid and hostile ONNX models, one small builder per case: what the import and quantize stages must
refuse with one line and exit 2 (tests/frontend/test_hostile_onnx.py, the fuzz test's seeds)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

X = [1, 4, 8, 8]


def _model(nodes, inits, inputs=None, outputs=None, opset: int = 17, ir_version: int = 8,
           out_rank: int = 4) -> onnx.ModelProto:
    inputs = inputs if inputs is not None else [helper.make_tensor_value_info("x", TensorProto.FLOAT, X)]
    outputs = outputs if outputs is not None else [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                                 [None] * out_rank)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def weights(shape=(4, 4, 3, 3), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.5, 0.5, shape).astype(np.float32)


def conv(w: np.ndarray | None = None, **attrs) -> onnx.ModelProto:
    """x -> Conv(w) -> Relu -> y: the good model every conv case starts from."""
    w = weights() if w is None else w
    attrs.setdefault("pads", [1, 1, 1, 1])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv0", **attrs),
             helper.make_node("Relu", ["c"], ["y"], name="relu0")]
    return _model(nodes, [numpy_helper.from_array(w, "w")])


def _tensor_with(name: str, dims, data_type: int, raw: bytes) -> TensorProto:
    t = TensorProto(name=name, data_type=data_type, dims=dims)
    t.raw_data = raw
    return t


def _unary(op: str, inputs: list[str], inits=(), out_rank: int = 4, **attrs) -> onnx.ModelProto:
    return _model([helper.make_node(op, inputs, ["y"], name=f"{op.lower()}0", **attrs)], list(inits), out_rank=out_rank)


def _qdq(scale: float) -> onnx.ModelProto:
    s = numpy_helper.from_array(np.array(scale, np.float32), "s")
    z = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q0"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq0"),
             helper.make_node("Relu", ["d"], ["y"], name="relu0")]
    return _model(nodes, [s, z])


def _cycle() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="add0"),
             helper.make_node("Relu", ["a"], ["b"], name="relu0"),
             helper.make_node("Relu", ["b"], ["y"], name="relu1")]
    return _model(nodes, [])


def _no_inputs() -> onnx.ModelProto:
    c = helper.make_node("Constant", [], ["y"], name="const0",
                         value=numpy_helper.from_array(np.ones((1, 4), np.float32)))
    return _model([c], [], inputs=[])


def _external(location: str) -> onnx.ModelProto:
    m = conv()
    t = m.graph.initializer[0]
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(4 * 4 * 4 * 3 * 3))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return m


def _custom_domain() -> onnx.ModelProto:
    m = _model([helper.make_node("Thing", ["x"], ["y"], name="t0", domain="com.example")], [])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    return m


# name -> (builder, text the one error line must contain)
CASES: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    "conv-strides-0": (lambda: conv(strides=[0, 0]), "node 'conv0' (Conv): strides [0, 0]"),
    "conv-dilations-0": (lambda: conv(dilations=[0, 1]), "node 'conv0' (Conv): dilations"),
    "conv-kernel-shape-0": (lambda: conv(kernel_shape=[0, 3]), "node 'conv0' (Conv): kernel_shape"),
    "conv-negative-pads": (lambda: conv(pads=[-1, 0, 0, 0]), "node 'conv0' (Conv): pads"),
    "conv-group-0": (lambda: conv(group=0), "node 'conv0' (Conv): group 0"),
    "conv-group-mismatch": (lambda: conv(group=3), "conv0"),
    "conv-weight-rank": (lambda: conv(w=weights((4, 4, 3))), "shape inference failed"),
    "conv-weight-channels": (lambda: conv(w=weights((4, 5, 3, 3))), "conv0"),
    "initializer-dtype-31": (lambda: _unary("Add", ["x", "b"], [_tensor_with("b", [1], 31, b"\0" * 4)]),
                             "initializer 'b' (input of node 'add0' (Add)) has an invalid data type 31"),
    "initializer-short-data": (lambda: _unary("Add", ["x", "b"], [_tensor_with("b", [4], TensorProto.FLOAT, b"\0" * 6)]),
                               "initializer 'b' (input of node 'add0' (Add)) has 6 bytes"),
    "initializer-no-data": (lambda: _unary("Add", ["x", "b"], [TensorProto(name="b", data_type=1, dims=[4])]),
                            "initializer 'b' (input of node 'add0' (Add)) has shape [4] but no data"),
    "weights-nan": (lambda: conv(w=np.full((4, 4, 3, 3), np.nan, np.float32)), "initializer 'w' (input of node 'conv0' (Conv)) holds NaN"),
    "weights-inf": (lambda: conv(w=np.full((4, 4, 3, 3), np.inf, np.float32)), "initializer 'w' (input of node 'conv0' (Conv)) holds inf"),
    "weights-3e38": (lambda: conv(w=np.full((4, 4, 3, 3), 3e38, np.float32)), "holds values up to 3e+38"),
    "no-graph-inputs": (_no_inputs, "no graph inputs"),
    "input-complex64": (lambda: _model([helper.make_node("Identity", ["x"], ["y"], name="id0")], [],
                                       inputs=[helper.make_tensor_value_info("x", TensorProto.COMPLEX64, [1, 4])]),
                        "input 'x' has type COMPLEX64"),
    "input-uint64": (lambda: _model([helper.make_node("Identity", ["x"], ["y"], name="id0")], [],
                                    inputs=[helper.make_tensor_value_info("x", TensorProto.UINT64, [1, 4])]),
                     "input 'x' has type UINT64"),
    "undefined-input": (lambda: _unary("Add", ["x", "nowhere"]), "nowhere"),
    "duplicate-output": (lambda: _model([helper.make_node("Relu", ["x"], ["y"], name="a"),
                                         helper.make_node("Relu", ["x"], ["y"], name="b")], []), "y"),
    "cycle": (_cycle, "error"),
    "unknown-op": (lambda: _unary("FooBar", ["x"]), "FooBar"),
    "custom-domain": (_custom_domain, "node 't0' (com.example:Thing): no lowering to TOSA and onnxruntime has no kernel"),
    "future-opset": (lambda: _unary("Relu", ["x"]).__class__.FromString(
        _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [], opset=99).SerializeToString()), "error"),
    "attribute-wrong-type": (lambda: _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv0",
                                                              strides=[1.5, 1.5])],
                                            [numpy_helper.from_array(weights(), "w")]), "conv0"),
    "matmul-mismatch": (lambda: _unary("MatMul", ["x", "w"], [numpy_helper.from_array(weights((5, 3)), "w")]), "matmul0"),
    "add-broadcast-mismatch": (lambda: _unary("Add", ["x", "b"], [numpy_helper.from_array(weights((3,)), "b")]), "add0"),
    "reshape-incompatible": (lambda: _unary("Reshape", ["x", "s"], [numpy_helper.from_array(np.array([3, 7], np.int64), "s")],
                                                     out_rank=2),
                             "reshape0"),
    "transpose-bad-perm": (lambda: _unary("Transpose", ["x"], perm=[0, 0, 1, 2]), "transpose0"),
    "concat-axis": (lambda: _model([helper.make_node("Concat", ["x", "x"], ["y"], name="concat0", axis=9)], []), "concat0"),
    "softmax-axis": (lambda: _unary("Softmax", ["x"], axis=7), "softmax0"),
    "depth-to-space-0": (lambda: _unary("DepthToSpace", ["x"], blocksize=0), "node 'depthtospace0' (DepthToSpace): blocksize 0"),
    "output-not-produced": (lambda: _model([helper.make_node("Relu", ["x"], ["r"], name="relu0")], []), "error"),
    "dq-zero-scale": (lambda: _qdq(0.0), "scale 0"),
    "dq-denormal-scale": (lambda: _qdq(1e-40), "scale 1e-40"),
    "dq-huge-scale": (lambda: _qdq(1e35), "1e+35"),
    **{f"cast-to-{t.lower()}": (lambda t=t: _model([helper.make_node("Relu", ["x"], ["r"], name="relu0"),
                                                   helper.make_node("Cast", ["r"], ["y"], name="cast0",
                                                                    to=getattr(TensorProto, t))], [],
                                                  outputs=[helper.make_tensor_value_info("y", getattr(TensorProto, t),
                                                                                         X)], opset=25),
                                f"node 'cast0' (Cast): makes a {t} tensor ('y')")  # the quantiser crashed on them
       for t in ("INT2", "UINT2", "INT4", "UINT4", "FLOAT8E8M0")},
    "external-outside": (lambda: _external("../secret.bin"), "outside the model's directory"),
    "external-absolute": (lambda: _external("/etc/hostname"), "is an absolute path"),
    "external-missing": (lambda: _external("weights.bin"), "external data 'weights.bin'"),
}
