"""tosa/graph.read_tosa reads the flatbuffer with struct, by field position: on real lowered graphs it must give
what Arm's own deserializer (tosa_serializer's C++ loader) reads from the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tosa_serializer as ts
from npbtest.lowering import downsampling_block, qdq_unet_step
from npbtest.ops import calib, quantize_model
from onnx import TensorProto, helper

from npubuild.lowering.driver import lower_model
from npubuild.tosa.graph import CONST_OPS, read_tosa

WINDOW_KEYS = ("kernel", "stride", "pad", "dilation")


def loaded_block(tosa: bytes, tmp: Path):
    """The graph's one basic block as tosa_serializer loads it from a file."""
    path = tmp / "g.tosa"
    path.write_bytes(tosa)
    ser = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
    assert ser.loadTosaFlatbuffer(str(path))
    return ser.regions[0].basicBlocks[0]


def window_fields(attributes) -> dict:
    return {k: [int(v) for v in getattr(attributes, k)] for k in WINDOW_KEYS if hasattr(attributes, k)}


def assert_reads_as_loaded(tosa: bytes, tmp: Path) -> None:
    info = read_tosa.__wrapped__(tosa)
    block = loaded_block(tosa, tmp)
    assert info.inputs == list(block.inputs) and info.outputs == list(block.outputs)
    assert list(info.tensors) == list(block.tensors)
    for name in block.tensors:
        t, mine = block.tensors[name], info.tensors[name]
        assert (mine.shape, mine.dtype, mine.is_const) == (tuple(t.shape), t.dtype.name, len(t.data) > 0), name
    assert len(info.ops) == len(block.operators)
    for mine, op in zip(info.ops, block.operators, strict=True):
        assert (mine.op, mine.inputs, mine.outputs) == (op.op.name, list(op.inputs), list(op.outputs))
        expected = window_fields(op.attributes) if mine.op in ("CONV2D", "DEPTHWISE_CONV2D", "MAX_POOL2D",
                                                               "AVG_POOL2D", "TRANSPOSE_CONV2D") else {}
        assert {k: v for k, v in mine.attr.items() if k != "axis"} == expected, mine.op
        if mine.op == "ARGMAX":
            assert mine.attr == {"axis": int(op.attributes.axis)}
    shapes = {name: tuple(int(v) for v in np.frombuffer(bytes(block.shapes[name].data), "<i8"))
              for name in block.shapes if len(block.shapes[name].data)}
    assert info.shapes == shapes


def test_unet_step_reads_as_loaded(tmp_path: Path) -> None:
    """Convs, a max pool (kernel, stride, pad), a bilinear RESIZE and a CONCAT (SHAPE operands)."""
    lowered = lower_model(qdq_unet_step(16, 8, 16), "int", family="u55")
    info = read_tosa(lowered.tosa)
    assert {"CONV2D", "MAX_POOL2D", "RESIZE"} <= {o.op for o in info.ops} and info.shapes
    assert any(o.attr.get("kernel") == [2, 2] for o in info.ops if o.op == "MAX_POOL2D")
    assert_reads_as_loaded(lowered.tosa, tmp_path)


@pytest.mark.parametrize("family", ["u55", "u85"])
def test_strided_block_reads_as_loaded(tmp_path: Path, family: str) -> None:
    """Stride-2 convs with padding, and the ops' non-CONST sequence is the lowering's own node_ops."""
    model = quantize_model(downsampling_block(8, 16, 8), calib("x", [1, 8, 8, 8], n=8))
    lowered = lower_model(model, "int", family=family)
    info = read_tosa(lowered.tosa)
    assert [o.op for o in info.ops if o.op not in CONST_OPS] == [k for ops in lowered.node_ops.values() for k in ops]
    assert any(o.attr.get("stride") == [2, 2] and any(o.attr.get("pad", ())) for o in info.ops)
    assert_reads_as_loaded(lowered.tosa, tmp_path)


def test_argmax_axis_reads_as_loaded(tmp_path: Path) -> None:
    """ARGMAX's axis, the one attribute read that is not a window."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("ArgMax", ["s"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "argmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 1, 4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = quantize_model(model, calib("x", [1, 6, 4, 4], n=8))
    lowered = lower_model(model, "int", family="u85")
    assert any(o.op == "ARGMAX" for o in read_tosa(lowered.tosa).ops)
    assert_reads_as_loaded(lowered.tosa, tmp_path)
