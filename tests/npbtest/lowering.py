"""Models and checks the lowering tests share: op lists, bit-exactness on the reference model and npu-sim,
the U-Net step the Concat and upsample tests build, and small model builders."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npbtest.npusim import assert_bitexact, reference, tosa_inputs, vela_raw
from npbtest.ops import (
    calib,
    io_dict,
    prepare,
    quantize_model,
    rand,
    single_op_model,
)
from npubuild.frontend.qdq_concat import share_concat_scales
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa


def ops(g: LoweredGraph) -> list[str]:
    return [op for node_ops in g.node_ops.values() for op in node_ops]


def assert_same_reference(a: LoweredGraph, b: LoweredGraph) -> None:
    io = io_dict(a)
    for seed in range(3):
        xs = tosa_inputs(io, seed)
        for i, (x, y) in enumerate(zip(reference(a.tosa, xs), reference(b.tosa, xs), strict=True)):
            assert np.array_equal(x, y), f"output {i}, seed {seed}: {int(np.count_nonzero(x != y))} elements differ"


def npu_bitexact(lowered) -> None:
    """The U55 command stream Vela compiles equals the TOSA reference model bit for bit (npubuild's npu-sim):
    catches Vela rewrites that change integer results, which placement counts cannot."""
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp)))


def model_of(nodes, inputs: dict[str, list[int]], outputs: dict[str, list[int]], inits: dict[str, np.ndarray]):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
                              [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def se_pool_model(channels: int, h: int, w: int, op: str = "ReduceMean") -> onnx.ModelProto:
    """Conv -> Relu -> mean over H, W (a squeeze-excite pool): the mean gets its own, finer scale."""
    inits = {"w1": np.random.default_rng(0).standard_normal((channels, 8, 1, 1)).astype(np.float32) * 0.3}
    if op == "ReduceMean":
        inits["axes"] = np.array([2, 3], np.int64)
        mean = helper.make_node("ReduceMean", ["a", "axes"], ["y"], keepdims=1)
    else:
        mean = helper.make_node("GlobalAveragePool", ["a"], ["y"])
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"]), helper.make_node("Relu", ["c"], ["a"]), mean]
    return model_of(nodes, {"x": [1, 8, h, w]}, {"y": [1, channels, 1, 1]}, inits)


def wrapped(op: str, in_shape, out_shape, inits=None, extra_inputs=(), **attrs):
    """x -> wrap -> op -> wrap -> y, so that onnxruntime quantizes op's input and output.

    The wrappers are ops onnxruntime quantizes even alone and that keep the
    layout: a 1x1 MaxPool for rank 4 (NHWC stays NHWC), a Reshape otherwise.
    """
    inits = dict(inits or {})

    def wrap(src: str, dst: str, shape, name: str):
        if len(shape) == 4:
            return helper.make_node("MaxPool", [src], [dst], name=name, kernel_shape=[1, 1])
        inits[f"s_{name}"] = np.array(shape, np.int64)
        return helper.make_node("Reshape", [src, f"s_{name}"], [dst], name=name)

    nodes = [wrap("x", "a", in_shape, "w_in"),
             helper.make_node(op, ["a", *extra_inputs], ["b"], name="the_op", **attrs),
             wrap("b", "y", out_shape, "w_out")]
    return model_of(nodes, {"x": in_shape}, {"y": out_shape}, inits)


def conv_model(shape, cout, k, group=1, stride=1, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.3, (cout, shape[1] // group, k, k)).astype(np.float32)
    inits = {"w": w}
    if bias:
        inits["b"] = rng.normal(0, 0.1, cout).astype(np.float32)
    return single_op_model("Conv", {"x": shape}, {"y": None}, inits, kernel_shape=[k, k], group=group,
                           strides=[stride, stride], pads=[k // 2] * 4)


def errors_vs_unfused_qdq(model, name: str, shape, spread: float, seeds=(10, 11)) -> np.ndarray:
    """|TOSA INT - QDQ reference| in LSB per output element, the reference being onnxruntime with graph
    optimisations off: DQ -> float op -> Q exactly as the QDQ model says (the optimised session fuses some
    of these into its own int8 kernels, e.g. QLinearSoftmax, which are themselves up to ~1.2 LSB off)."""
    qdq = quantize_model(model, calib(name, shape, low=-spread, high=spread))
    lowered = lower_model(qdq, "int")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    out = lowered.outputs[0]
    errs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "qdq.onnx"
        onnx.save(qdq, path)
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        for seed in seeds:
            feeds = {name: rand(shape, seed, -spread, spread)}
            ref = sess.run([out.onnx_name], feeds)[0]
            got = run_tosa(lowered.tosa, lowered, feeds)[out.onnx_name].astype(np.float64)
            errs.append(np.abs(out.quantize_reference(ref) - got).ravel())
    return np.concatenate(errs)


UNET_SHAPE = [1, 2, 16, 16]


def unet_step(size: int = 16, skip: int = 8, deep: int = 16, extra_reader: bool = False,
              seed: int = 0) -> onnx.ModelProto:
    """Float x -> conv+relu (skip) -> maxpool -> conv+relu (deep) -> bilinear 2x -> concat(up, skip) -> conv;
    with `extra_reader` the upsample is also a graph output."""
    rng = np.random.default_rng(seed)

    def conv(name: str, cin: int, cout: int, k: int, scale: float) -> list:
        return [numpy_helper.from_array((rng.standard_normal((cout, cin, k, k)) * scale).astype(np.float32), f"{name}_w"),
                numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"{name}_b")]

    inits = [*conv("c1", 2, skip, 3, 0.4), *conv("c2", skip, deep, 3, 0.5), *conv("c3", skip + deep, 4, 1, 0.3),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [
        helper.make_node("Conv", ["x", "c1_w", "c1_b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["skip"]),
        helper.make_node("MaxPool", ["skip"], ["pool"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["pool", "c2_w", "c2_b"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["deep"]),
        helper.make_node("Resize", ["deep", "", "scales"], ["up"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
        helper.make_node("Concat", ["up", "skip"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "c3_w", "c3_b"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, size, size])]
    if extra_reader:
        outputs.append(helper.make_tensor_value_info("up", TensorProto.FLOAT, [1, deep, size, size]))
    graph = helper.make_graph(nodes, "unet_step",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, size, size])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return prepare(model)


@pytest.fixture(scope="module")
def models() -> tuple[onnx.ModelProto, onnx.ModelProto, onnx.ModelProto]:
    """(float, onnxruntime's QDQ, QDQ after the post-pass)."""
    fp = unet_step()
    qdq = quantize_model(fp, calib("x", UNET_SHAPE, n=16))
    shared = copy.deepcopy(qdq)
    assert share_concat_scales(shared) > 0
    return fp, qdq, shared


def max_copies(tosa: bytes) -> list[int]:
    """Positions of the CONCAT inputs that are a MAXIMUM of one tensor with itself (between RESCALEs)."""
    info = read_tosa(tosa)
    producer = {out: op for op in info.ops for out in op.outputs}
    found = []
    for op in info.ops:
        if op.op != "CONCAT":
            continue
        for pos, t in enumerate(op.inputs):
            narrow = producer.get(t)
            top = producer.get(narrow.inputs[0]) if narrow is not None and narrow.op == "RESCALE" else None
            if top is not None and top.op == "MAXIMUM" and all(producer[i].op == "RESCALE" for i in top.inputs):
                if len({producer[i].inputs[0] for i in top.inputs}) == 1:
                    found.append(pos)
    return found


def downsampling_block(c: int = 32, o: int = 64, hw: int = 16):
    """A conv, then ResNet's downsampling block: 3x3 stride-2 conv and a 1x1 stride-2 shortcut from one input, then Add."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, (o, c, 3, 3)).astype(np.float32), "w3"),
             numpy_helper.from_array(rng.normal(0, 0.1, (o, c, 1, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, o).astype(np.float32), "b3"),
             numpy_helper.from_array(rng.normal(0, 0.1, o).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.2, (c, c, 1, 1)).astype(np.float32), "w0")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["p"], name="conv0"),
             helper.make_node("Relu", ["p"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w3", "b3"], ["a"], name="conv3", strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["r", "w1", "b1"], ["s"], name="shortcut", strides=[2, 2]),
             helper.make_node("Add", ["a", "s"], ["y"], name="add")]
    g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, hw // 2, hw // 2])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


BIG_UNET = (32, 16, 32)  # input size, skip channels, deep channels: replicated 36x36x32 (41 KiB), split


def qdq_unet_step(size: int, skip: int, deep: int, extra_reader: bool = False) -> onnx.ModelProto:
    """test_concat_scales' U-Net step, quantised, its Concat sharing one scale as the quantize stage leaves it."""
    qdq = quantize_model(unet_step(size, skip, deep, extra_reader, seed=1), calib("x", [1, 2, size, size], n=16))
    share_concat_scales(qdq)
    return qdq


def rows_of_every_spread(shape: list[int]) -> np.ndarray:
    """Rows from constant to full range, each with its own offset: the rsqrt sees every exponent."""
    rng = np.random.default_rng(4)
    rows, k = shape
    spread = np.geomspace(1e-3, 2.0, rows - 1)
    x = rng.uniform(-1, 1, (rows - 1, k)) * spread[:, None] + rng.uniform(-1, 1, (rows - 1, 1)) * (2 - spread[:, None])
    return np.vstack([x, np.full((1, k), 0.3)]).astype(np.float32)
