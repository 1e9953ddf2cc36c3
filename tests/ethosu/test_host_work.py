"""ethosu/host_work.py: the multiply-accumulates of host nodes from inferred shapes (npubuild times no host CPU,
so what the host computes is counted instead)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.ethosu.host_work import node_macs
from npubuild.lowering.fallback import value_infos


def _model(nodes, inputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_contractions_count_their_multiply_accumulates_and_the_rest_none():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="fc"),                      # [1, 8, 64] x [64, 32]
             helper.make_node("Gemm", ["m2", "g"], ["gm"], name="gemm", transB=1),          # [8, 64] x [16, 64]^T
             helper.make_node("Conv", ["img", "k"], ["c"], name="conv", pads=[1, 1, 1, 1]),  # 3 -> 4, 3x3, 10x10
             helper.make_node("Conv", ["c", "dw"], ["d"], name="dw", group=4, pads=[1, 1, 1, 1]),
             helper.make_node("ConvTranspose", ["d", "t"], ["u"], name="up", strides=[2, 2]),  # 4 -> 2, 2x2
             helper.make_node("LRN", ["u"], ["l"], name="lrn", size=5),
             helper.make_node("Log", ["l"], ["y"], name="log")]
    model = _model(nodes, [("x", [1, 8, 64]), ("m2", [8, 64]), ("img", [1, 3, 10, 10])],
                   [("w", [64, 32]), ("g", [16, 64]), ("k", [4, 3, 3, 3]), ("dw", [4, 1, 3, 3]), ("t", [4, 2, 2, 2])])
    infos = value_infos(model)
    macs = {n.name: node_macs(n, infos) for n in model.graph.node}
    assert macs == {"fc": 8 * 32 * 64, "gemm": 8 * 16 * 64, "conv": 4 * 100 * 3 * 9, "dw": 4 * 100 * 9,
                    "up": 4 * 100 * 2 * 4, "lrn": 2 * 400 * 5, "log": 0}


def test_unknown_shapes_and_control_flow_count_none_not_zero():
    dyn = _model([helper.make_node("MatMul", ["x", "w"], ["m"], name="fc")], [("x", ["n", 64])], [("w", [64, 8])])
    assert node_macs(dyn.graph.node[0], value_infos(dyn)) is None
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1])])
    cond = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
    assert node_macs(cond, {}) is None
