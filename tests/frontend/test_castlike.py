"""CastLike at import: only its second input's type is read, so it becomes a Cast (a constant one folds).

ONNX's function bodies (the `_expanded` node tests: Elu, Selu, LeakyRelu, PRelu, Shrink, ThresholdedRelu...)
cast every literal with CastLike(literal, x). Left as it was, x looked like data the cast reads, and a
partition boundary could run through the literal (no TOSA op computes it) or through x (a zero-size x had no
TOSA form): tests/conformance has those tests, this holds the import's form."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.normalise import normalise
from npubuild.tosa.run import OnnxSession


def _model() -> onnx.ModelProto:
    nodes = [helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
             helper.make_node("CastLike", ["zero", "x"], ["zero_f"], name="literal"),
             helper.make_node("Less", ["x", "zero_f"], ["neg"], name="less"),
             helper.make_node("Cast", ["neg"], ["neg_i"], to=TensorProto.INT32, name="to_int"),
             helper.make_node("CastLike", ["neg_i", "x"], ["y"], name="back")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def test_castlike_becomes_a_cast_and_its_literal_a_constant():
    model = _model()
    out = normalise(model, {"x": [1, 8]}, "m.onnx")
    ops = [n.op_type for n in out.graph.node]
    assert "CastLike" not in ops and ops.count("Cast") == 2  # Less's bool to int32, and back to x's float
    back = next(n for n in out.graph.node if n.output[0] == "y")
    assert back.op_type == "Cast" and list(back.input) == ["neg_i"]
    assert helper.get_attribute_value(next(a for a in back.attribute if a.name == "to")) == TensorProto.FLOAT
    less = next(n for n in out.graph.node if n.op_type == "Less")
    assert less.input[1] in {i.name for i in out.graph.initializer}  # the literal folded: no node makes it
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 1.0, -3.0, 4.0, -0.0]], np.float32)
    want = OnnxSession(model.SerializeToString())({"x": x})["y"]
    assert np.array_equal(OnnxSession(out.SerializeToString())({"x": x})["y"], want)
