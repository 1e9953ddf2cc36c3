"""A Conv1d stack with residual Adds (a TCN) stays rank 4 end to end; dilated convs run on the phase view.

Each 1-D value (a graph input too) is held as its one-row NHWC image (context.RowImage), so Vela finds no
RESHAPE between the blocks to turn into a MemoryCopy (the block input feeds the next conv and the Add) and no
TRANSPOSE is needed; a conv dilated by d >= dilation_phase_min runs as an undilated (k, 1) conv on the view
[N, L/d, d, C]. Checked with the real tools: the TOSA reference model against the portable graph and
onnxruntime's QDQ model, and Vela.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from npbtest.ops import calib, check_fp, check_int, quantize_model, vela_run
from onnx import TensorProto, helper, numpy_helper

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.graph import CONST_OPS, read_tosa
from npubuild.tosa.run import run_tosa

SHAPE = [1, 6, 128]  # [N, C, L]; 16 channels without the stem


def residual_tcn(stem: bool = True, dilations=(1, 2, 4, 8)):
    """A stem Conv1d to 16 channels (tcn_imu's form; without it the graph input feeds the first residual Add),
    then per block: causal Conv1d k=3 (left pad 2d) -> Relu -> causal Conv1d -> Add(block input) -> Relu."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (16, 6, 3)).astype(np.float32), "ws"),
             numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), "bs")]
    nodes = [helper.make_node("Conv", ["x", "ws", "bs"], ["cs"], kernel_shape=[3], pads=[2, 0]),
             helper.make_node("Relu", ["cs"], ["rs"])] if stem else []
    x = "rs" if stem else "x"
    for i, d in enumerate(dilations):
        for j in range(2):
            inits += [numpy_helper.from_array(rng.normal(0, 0.25, (16, 16, 3)).astype(np.float32), f"w{i}{j}"),
                      numpy_helper.from_array(rng.normal(0, 0.1, 16).astype(np.float32), f"b{i}{j}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}0", f"b{i}0"], [f"c{i}0"], dilations=[d], kernel_shape=[3],
                                   pads=[2 * d, 0]),
                  helper.make_node("Relu", [f"c{i}0"], [f"r{i}0"]),
                  helper.make_node("Conv", [f"r{i}0", f"w{i}1", f"b{i}1"], [f"c{i}1"], dilations=[d],
                                   kernel_shape=[3], pads=[2 * d, 0]),
                  helper.make_node("Add", [x, f"c{i}1"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"y{i}"])]
        x = f"y{i}"
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["y"]))
    g = helper.make_graph(nodes, "tcn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape(stem))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 1])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def shape(stem: bool) -> list[int]:
    return SHAPE if stem else [1, 16, SHAPE[2]]


def _ops(tosa: bytes):
    g = read_tosa(tosa)
    return g, [op for op in g.ops if op.op not in CONST_OPS]


@pytest.mark.parametrize("fam, target, views", [("u55", "ethos-u55-128", 2), ("u65", "ethos-u65-256", 1),
                                                ("u85", "ethos-u85-256", 2)])
@pytest.mark.parametrize("stem", [True, False])
def test_blocks_stay_rank4_and_match_the_references(fam, target, views, stem):
    qdq = quantize_model(residual_tcn(stem), calib("x", shape(stem)))
    lowered = lower_model(qdq, "int", family=fam)
    g, ops = _ops(lowered.tosa)
    last_add = max(i for i, op in enumerate(ops) if op.op == "ADD")
    planar = FAMILY_OPTIONS[fam].planar_1d_input(shape(stem)[1])  # u65: the 6-channel input NCL
    assert [op.op for op in ops if op.op == "TRANSPOSE"] == (["TRANSPOSE"] if planar else [])
    assert ops[int(planar)].op == "RESHAPE"  # the channels-last input [1, 128, C] to [1, 1, 128, C]
    assert lowered.inputs[0].perm == ((0, 1, 2) if planar else (0, 2, 1))
    body = ops[1 + int(planar):last_add + 1]
    assert all(len(g.tensors[t].shape) == 4 for op in body for t in op.inputs + op.outputs
               if t in g.tensors and not g.tensors[t].is_const)
    reshapes = [op for op in body if op.op == "RESHAPE"]
    assert len(reshapes) == views  # only the phase-view changes (d = 4, 8 on u55/u85; d = 8 on u65)
    assert sum(op.op == "CONV2D" and op.attr["dilation"] == [1, 1] for op in body) == 2 + stem + 2 * views
    run = vela_run(lowered.tosa, target)
    assert not [r for r in run.layers if r["NNG Operator"] == "MemoryCopy"]
    portable = lower_model(qdq, "int")
    for seed in range(2):
        feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, shape(stem)).astype(np.float32)}
        a, b = run_tosa(portable.tosa, portable, feeds), run_tosa(lowered.tosa, lowered, feeds)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    feeds = {"x": np.random.default_rng(5).uniform(-1, 1, shape(stem)).astype(np.float32)}
    _, worst = check_int(residual_tcn(stem), calib("x", shape(stem)), feeds, max_lsb=1.0,
                         options=FAMILY_OPTIONS[fam])
    assert worst <= 1.0


def test_phase_view_is_faster_than_zero_taps_on_u55():
    qdq = quantize_model(residual_tcn(), calib("x", SHAPE))
    phase = lower_model(qdq, "int", family="u55")
    taps = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u55"], dilation_phase_min=None))
    g, ops = _ops(taps.tosa)
    kernels = [g.tensors[op.inputs[1]].shape[1:3] for op in ops if op.op == "CONV2D"]
    assert (1, 9) in kernels and (1, 5) in kernels  # d = 8 and 4 as zero taps at dilation 2 instead
    g, ops = _ops(phase.tosa)
    kernels = [g.tensors[op.inputs[1]].shape[1:3] for op in ops if op.op == "CONV2D"]
    assert kernels.count((3, 1)) == 4 and (1, 9) not in kernels
    assert vela_run(phase.tosa, "ethos-u55-128").cycles < 0.9 * vela_run(taps.tosa, "ethos-u55-128").cycles


@pytest.mark.parametrize("stem", [True, False])
def test_fp_profile_takes_the_same_rank4_form(stem):
    """The FP lowering holds the 1-D values as RowImages too: no TRANSPOSE, close to onnxruntime's float model."""
    feeds = {"x": np.random.default_rng(1).uniform(-1, 1, shape(stem)).astype(np.float32)}
    lowered = check_fp(residual_tcn(stem), feeds)
    assert not [op for op in _ops(lowered.tosa)[1] if op.op == "TRANSPOSE"]
