"""Compute-heavy ops, FP and INT against onnxruntime, INT compiled by Vela for one U55 and one U85.

Ops that onnxruntime does not quantize by default (ReduceMean, GlobalMaxPool...)
are mostly tested between two layout-preserving ops it does quantize (1x1
MaxPool, Reshape), as they sit inside a real network; the quantize stage
also asks for them alone (frontend.quantized_ops, the lowerings' registry.quantize_also), checked by
test_lone_ops_are_quantized.
"""

from __future__ import annotations

import numpy as np
import pytest
from npbtest.lowering import conv_model, errors_vs_unfused_qdq, model_of, npu_bitexact, wrapped
from npbtest.ops import (
    calib,
    check_fp,
    check_int,
    quantize_model,
    rand,
    single_op_model,
    vela_op_counts,
)
from onnx import helper

from npubuild.lowering.driver import lower_model

ACCELERATORS = ("ethos-u55-128", "ethos-u85-256")


def all_on_npu(lowered, accelerators=ACCELERATORS) -> None:
    for accel in accelerators:
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu >= 1, (accel, npu, cpu)


def tosa_ops(lowered) -> set[str]:
    return {op for ops in lowered.node_ops.values() for op in ops}


# ---------------------------------------------------------------------------------------------- convolutions


@pytest.mark.parametrize("case", [
    dict(shape=[1, 8, 7, 7], cout=8, k=3, group=2),
    dict(shape=[1, 6, 8, 8], cout=12, k=3, group=3, stride=2),
    dict(shape=[1, 4, 6, 6], cout=8, k=1, group=4),  # group == C but a channel multiplier with >1 input: depthwise
    dict(shape=[1, 4, 6, 6], cout=6, k=3, bias=False),
], ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_grouped_and_biasless_conv(case):
    model = conv_model(**case)
    shape = case["shape"]
    check_fp(model, {"x": rand(shape, 1)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)})
    assert "TRANSPOSE" not in tosa_ops(lowered)
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("case", [
    dict(shape=[1, 4, 5, 5], cout=6, k=3, stride=2, pads=[1, 1, 1, 1], output_padding=[1, 1]),
    dict(shape=[1, 4, 4, 4], cout=4, k=2, stride=2, pads=[0, 0, 0, 0]),
    dict(shape=[1, 3, 5, 5], cout=2, k=3, stride=1, pads=[1, 1, 1, 1], bias=False),
    dict(shape=[1, 4, 4, 6], cout=4, k=4, stride=2, pads=[1, 1, 1, 1]),
    dict(shape=[1, 4, 5, 5], cout=4, k=3, stride=2, auto_pad="SAME_UPPER"),
    dict(shape=[1, 4, 5, 5], cout=4, k=3, stride=2, output_shape=[10, 9]),
    dict(shape=[1, 4, 5, 5], cout=6, k=3, stride=2, pads=[1, 1, 1, 1], group=2),
], ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_conv_transpose(case):
    case = dict(case)
    rng = np.random.default_rng(0)
    shape, cout, k = case.pop("shape"), case.pop("cout"), case.pop("k")
    stride = case.pop("stride")
    inits = {"w": rng.normal(0, 0.3, (shape[1], cout // case.get("group", 1), k, k)).astype(np.float32)}
    if case.pop("bias", True):
        inits["b"] = rng.normal(0, 0.1, cout).astype(np.float32)
    model = single_op_model("ConvTranspose", {"x": shape}, {"y": None}, inits, kernel_shape=[k, k],
                            strides=[stride, stride], **case)
    check_fp(model, {"x": rand(shape, 1)})
    # onnxruntime cannot quantize a grouped ConvTranspose per channel (its scales do not broadcast)
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)}, per_channel=case.get("group", 1) == 1)
    assert "TRANSPOSE_CONV2D" in tosa_ops(lowered)
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("trans_a,trans_b,alpha,beta,c_shape", [
    (1, 0, 1.0, 1.0, [10]),
    (0, 1, 0.5, 2.0, [10]),
    (1, 1, -1.5, 0.25, [10]),
    (0, 0, 1.0, 1.0, None),
])
def test_gemm_attributes(trans_a, trans_b, alpha, beta, c_shape):
    rng = np.random.default_rng(0)
    x_shape = [16, 3] if trans_a else [3, 16]
    inits = {"w": rng.normal(0, 0.3, (10, 16) if trans_b else (16, 10)).astype(np.float32)}
    if c_shape is not None:
        inits["c"] = rng.normal(0, 0.2, c_shape).astype(np.float32)
    model = single_op_model("Gemm", {"x": x_shape}, {"y": None}, inits, transA=trans_a, transB=trans_b,
                            alpha=alpha, beta=beta)
    check_fp(model, {"x": rand(x_shape, 1)})
    lowered, _ = check_int(model, calib("x", x_shape), {"x": rand(x_shape, 2)})
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("a_shape,w_shape", [([2, 5, 16], [16, 8]), ([2, 3, 4, 16], [16, 6]), ([16], [16, 4])])
def test_matmul_constant_weight_batched_input(a_shape, w_shape):
    w = np.random.default_rng(0).normal(0, 0.3, w_shape).astype(np.float32)
    model = single_op_model("MatMul", {"x": a_shape}, {"y": None}, {"w": w})
    check_fp(model, {"x": rand(a_shape, 1)})
    lowered, _ = check_int(model, calib("x", a_shape), {"x": rand(a_shape, 2)})
    all_on_npu(lowered)


@pytest.mark.parametrize("trans_b,alpha", [(0, 1.0), (1, 0.5)])
def test_gemm_with_activation_b(trans_b, alpha):
    b_shape = [5, 8] if trans_b else [8, 5]
    model = single_op_model("Gemm", {"a": [3, 8], "b": b_shape}, {"y": None}, transB=trans_b, alpha=alpha)
    feeds = {"a": rand([3, 8], 1), "b": rand(b_shape, 2)}
    check_fp(model, feeds)
    lowered, _ = check_int(model, {**calib("a", [3, 8]), **calib("b", b_shape, seed=3)}, feeds)
    assert "MATMUL" in tosa_ops(lowered)
    all_on_npu(lowered)


def test_matmul_batched_constant_weight():
    w = np.random.default_rng(0).normal(0, 0.3, (3, 8, 5)).astype(np.float32)
    model = single_op_model("MatMul", {"x": [3, 4, 8]}, {"y": None}, {"w": w})
    check_fp(model, {"x": rand([3, 4, 8], 1)})
    lowered, _ = check_int(model, calib("x", [3, 4, 8]), {"x": rand([3, 4, 8], 2)})
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("a_shape,b_shape", [
    ([4, 8], [8, 5]),
    ([2, 4, 8], [2, 8, 5]),
    ([1, 2, 6, 8], [1, 2, 8, 6]),  # attention scores: [B, heads, S, d] x [B, heads, d, S]
    ([2, 3, 8], [8, 4]),
    ([3, 8], [2, 8, 5]),  # A broadcast over B's batch: TILE
    ([8], [2, 8, 3]),  # 1-D A
    ([2, 4, 8], [8]),  # 1-D B
])
def test_matmul_two_activations(a_shape, b_shape):
    model = single_op_model("MatMul", {"a": a_shape, "b": b_shape}, {"y": None})
    feeds = {"a": rand(a_shape, 1), "b": rand(b_shape, 2, -2, 2)}
    check_fp(model, feeds)
    cal = {**calib("a", a_shape), **calib("b", b_shape, seed=7, low=-2, high=2)}
    lowered, _ = check_int(model, cal, feeds)
    assert "MATMUL" in tosa_ops(lowered)
    all_on_npu(lowered)
    npu_bitexact(lowered)


# ---------------------------------------------------------------------------------------------- reductions


def _reduced(shape, axes, keepdims):
    axes = [a % len(shape) for a in axes]
    return [1 if i in axes else s for i, s in enumerate(shape) if keepdims or i not in axes]


REDUCE_CASES = [
    ("ReduceMean", [1, 4, 6, 6], [2, 3], 1),
    ("ReduceMean", [1, 4, 6, 6], [2, 3], 0),
    ("ReduceMean", [1, 4, 6, 6], [1], 1),
    ("ReduceMean", [2, 5, 8], [-1], 1),
    ("ReduceSum", [1, 4, 6, 6], [1], 0),
    ("ReduceSum", [2, 5, 8], [1, 2], 1),
    ("ReduceMax", [1, 4, 6, 6], [2, 3], 1),
    ("ReduceMax", [2, 5, 8], [-1], 0),
    ("ReduceMin", [1, 4, 6, 6], [1], 1),
    ("ReduceMean", [2, 3, 4], [0, 1, 2], 1),  # every axis: one merged reduction
]


# ReduceSum has taken its axes as an input since opset 13 (older models are converted at import): no attribute case.
REDUCE_MATRIX = [(*case, axes_as) for axes_as in ("attribute", "input") for case in REDUCE_CASES
                 if not (axes_as == "attribute" and case[0] == "ReduceSum")]


@pytest.mark.parametrize("op,shape,axes,keepdims,axes_as", REDUCE_MATRIX)
def test_reductions(op, shape, axes, keepdims, axes_as):
    out_shape = _reduced(shape, axes, keepdims)
    if axes_as == "input":
        model = wrapped(op, shape, out_shape, {"axes": np.array(axes, np.int64)}, ["axes"], keepdims=keepdims)
    else:
        model = wrapped(op, shape, out_shape, keepdims=keepdims, axes=axes)
        model.opset_import[0].version = 13
    check_fp(model, {"x": rand(shape, 1)}, atol=1e-5)
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)})
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("op,attrs,out_shape", [
    ("ReduceMean", {"axes": [1], "keepdims": 1}, [1, 1, 5, 5]),
    ("ReduceMax", {"axes": [2, 3], "keepdims": 0}, [1, 4]),
    ("GlobalMaxPool", {}, [1, 4, 1, 1]),
    ("LogSoftmax", {"axis": 1}, [1, 4, 5, 5]),
])
def test_lone_ops_are_quantized(op, attrs, out_shape):
    model = single_op_model(op, {"x": [1, 4, 5, 5]}, {"y": out_shape}, **attrs)
    model.opset_import[0].version = 13
    qdq = quantize_model(model, calib("x", [1, 4, 5, 5]))
    assert [n.op_type for n in qdq.graph.node].count("QuantizeLinear") == 2
    lowered, _ = check_int(model, calib("x", [1, 4, 5, 5]), {"x": rand([1, 4, 5, 5], 2)})
    all_on_npu(lowered)
    npu_bitexact(lowered)


def test_quantize_asks_for_exactly_the_op_types_the_lowerings_declare():
    """The quantize stage's list is data (it must not import the lowering); the op modules declare theirs."""
    from npubuild.frontend.quantized_ops import QUANTIZE_ALSO
    from npubuild.lowering import load_all
    from npubuild.lowering.registry import QUANTIZE_ALSO as DECLARED

    load_all()
    assert QUANTIZE_ALSO == DECLARED


def test_spatial_mean_is_one_exact_reduction():
    """A mean over H, W (as in squeeze-excite) is one REDUCE_SUM of the merged H*W axis, rounded once:
    half the Vela cycles of a depthwise conv of ones, and no TRANSPOSE in the TOSA."""
    model = wrapped("ReduceMean", [1, 8, 5, 7], [1, 8, 1, 1], keepdims=1, axes=[2, 3])
    model.opset_import[0].version = 13
    lowered, err = check_int(model, calib("x", [1, 8, 5, 7]), {"x": rand([1, 8, 5, 7], 2)})
    ops = [op for node_ops in lowered.node_ops.values() for op in node_ops]
    assert ops.count("REDUCE_SUM") == 1 and "TRANSPOSE" not in ops and "DEPTHWISE_CONV2D" not in ops
    npu_bitexact(lowered)


@pytest.mark.parametrize("shape", [[1, 16, 32, 32], [1, 8, 5, 7]])
def test_global_average_pool_changing_scale(shape):
    """onnxruntime gives GlobalAveragePool its own output scale: the exact REDUCE_SUM path."""
    model = single_op_model("GlobalAveragePool", {"x": shape}, {"y": None})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)})
    assert "REDUCE_SUM" in tosa_ops(lowered)
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("shape", [[1, 4, 5, 5], [1, 3, 8, 12]])
def test_global_max_pool(shape):
    model = wrapped("GlobalMaxPool", shape, [*shape[:2], 1, 1])
    check_fp(model, {"x": rand(shape, 1)})
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)})
    all_on_npu(lowered)
    npu_bitexact(lowered)


# ---------------------------------------------------------------------------------------------- softmax

SOFTMAX_CASES = [([2, 8], -1, 1.0), ([1, 4, 6, 6], 1, 2.0), ([2, 3, 10], 1, 4.0), ([1, 2, 5, 64], -1, 6.0)]


@pytest.mark.parametrize("shape,axis,spread", SOFTMAX_CASES)
def test_softmax(shape, axis, spread):
    """onnxruntime quantizes a lone Softmax (output scale 1/255, zero point -128)."""
    model = single_op_model("Softmax", {"x": shape}, {"y": None}, axis=axis)
    check_fp(model, {"x": rand(shape, 1, -spread, spread)}, atol=1e-6)
    lowered, err = check_int(model, calib("x", shape, low=-spread, high=spread), {"x": rand(shape, 2, -spread, spread)})
    print(f"softmax {shape} axis {axis}: max error {err} LSB")
    # the reduction axis must be physically last (the channel axis of NHWC is): else one int8 TRANSPOSE first
    physically_last = axis in (-1, len(shape) - 1) and len(shape) != 4 or (len(shape) == 4 and axis == 1)
    assert ("TRANSPOSE" in tosa_ops(lowered)) != physically_last
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("shape,axis,spread", SOFTMAX_CASES[:3])
def test_log_softmax(shape, axis, spread):
    """onnxruntime does not quantize LogSoftmax alone: test it between quantized wrappers."""
    model = wrapped("LogSoftmax", shape, shape, axis=axis)
    check_fp(model, {"x": rand(shape, 1, -spread, spread)}, atol=1e-5)
    lowered, err = check_int(model, calib("x", shape, low=-spread, high=spread), {"x": rand(shape, 2, -spread, spread)})
    print(f"log softmax {shape} axis {axis}: max error {err} LSB")
    all_on_npu(lowered)
    npu_bitexact(lowered)


# ---------------------------------------------------------------------------------------------- normalisation


def _affine(n: int, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"g": rng.uniform(-1.5, 1.5, n).astype(np.float32), "b": rng.normal(0, 0.3, n).astype(np.float32)}


@pytest.mark.parametrize("shape,axis,spread", [
    ([2, 8], -1, 1.0),
    ([2, 4, 16], -1, 3.0),
    ([1, 6, 64], -1, 2.0),  # a transformer row
    ([2, 3, 4, 5], 2, 1.0),  # normalised over two trailing dims (onnxruntime cannot quantize a 2-D gamma)
])
def test_layer_norm(shape, axis, spread):
    k = int(np.prod(shape[axis:]))
    inits = _affine(k)
    inits = {"g": inits["g"].reshape(shape[axis:]), "b": inits["b"].reshape(shape[axis:])}
    model = single_op_model("LayerNormalization", {"x": shape}, {"y": None}, inits, axis=axis, epsilon=1e-5)
    check_fp(model, {"x": rand(shape, 1, -spread, spread)}, atol=1e-4)
    if len(shape[axis:]) > 1:
        return
    lowered, err = check_int(model, calib("x", shape, low=-spread, high=spread), {"x": rand(shape, 2, -spread, spread)})
    print(f"layer norm {shape} axis {axis}: max error {err} LSB")
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("shape", [[1, 4, 5, 5], [2, 3, 6, 4], [2, 4, 12], [1, 2, 32, 32]])
def test_instance_norm(shape):
    model = single_op_model("InstanceNormalization", {"x": shape}, {"y": None}, _affine(shape[1]), epsilon=1e-5)
    check_fp(model, {"x": rand(shape, 1)}, atol=1e-4)
    lowered, err = check_int(model, calib("x", shape), {"x": rand(shape, 2)})
    print(f"instance norm {shape}: max error {err} LSB")
    assert ("TRANSPOSE" in tosa_ops(lowered)) == (len(shape) == 4)  # INT reduces NCHW rows: C moves first
    all_on_npu(lowered)
    npu_bitexact(lowered)


@pytest.mark.parametrize("shape", [[1, 4, 5, 5], [3, 6], [2, 4, 7]])
def test_batch_norm_not_folded(shape):
    """A BatchNormalization with no Conv/Gemm before it stays at import: a depthwise 1x1 conv in int8."""
    rng = np.random.default_rng(0)
    c = shape[1]
    inits = {"scale": rng.uniform(-2, 2, c).astype(np.float32), "B": rng.normal(0, 0.5, c).astype(np.float32),
             "mean": rng.normal(0, 0.3, c).astype(np.float32), "var": rng.uniform(0.2, 2, c).astype(np.float32)}
    model = single_op_model("BatchNormalization", {"x": shape}, {"y": None}, inits, epsilon=1e-5)
    check_fp(model, {"x": rand(shape, 1)}, atol=1e-5)
    lowered, _ = check_int(model, calib("x", shape), {"x": rand(shape, 2)})
    assert tosa_ops(lowered) <= {"DEPTHWISE_CONV2D", "RESCALE", "RESHAPE", "TRANSPOSE"}
    assert ("TRANSPOSE" in tosa_ops(lowered)) == (len(shape) == 3)  # [N, C, L] must move C last
    all_on_npu(lowered)
    npu_bitexact(lowered)


# ---------------------------------------------------------------------------------------------- accuracy of the decompositions


@pytest.mark.parametrize("shape,spread", [([4, 1000], 8.0), ([2, 4, 16, 16], 4.0), ([8, 10], 0.1)])
def test_softmax_is_bit_exact_against_the_qdq_semantics(shape, spread):
    """Exp in Q15 and a Newton-Raphson reciprocal leave only the final rounding: measured at most 1 LSB, on
    under 0.1% of the elements (values within float error of a rounding tie), elsewhere bit-exact."""
    err = errors_vs_unfused_qdq(single_op_model("Softmax", {"x": shape}, {"y": None}, axis=-1), "x", shape, spread)
    print(f"softmax {shape}: max {err.max()} LSB on {100 * (err > 0).mean():.3f}% of {err.size}")
    assert err.max() <= 1 and (err > 0).mean() <= 0.001


@pytest.mark.parametrize("shape,spread", [([4, 768], 3.0), ([16, 128], 1.0)])
def test_layer_norm_accuracy_against_the_qdq_semantics(shape, spread):
    """Measured: at most 1 LSB, on 0.37% (K=128) and 0.75% (K=768, gammas near 0 widen the int16 range) of the
    elements, all at rounding ties: the affine step runs as an int16 depthwise conv for speed (with an int32
    MUL/ADD it was 0.03%, at a third more U55 cycles)."""
    k = shape[-1]
    rng = np.random.default_rng(0)
    inits = {"g": rng.uniform(-2, 2, k).astype(np.float32), "b": rng.normal(0, 0.5, k).astype(np.float32)}
    model = single_op_model("LayerNormalization", {"x": shape}, {"y": None}, inits, axis=-1)
    err = errors_vs_unfused_qdq(model, "x", shape, spread)
    print(f"layer norm {shape}: max {err.max()} LSB on {100 * (err > 0).mean():.3f}% of {err.size}")
    assert err.max() <= 1 and (err > 0).mean() <= 0.01


# ---------------------------------------------------------------------------------------------- small chains


def test_classifier_head_chain():
    """Conv -> ReduceMean over H, W (keepdims 0) -> Gemm -> Softmax: layouts meet without a TRANSPOSE."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "fc": rng.normal(0, 0.3, (8, 5)).astype(np.float32),
             "fb": rng.normal(0, 0.1, 5).astype(np.float32), "axes": np.array([2, 3], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("ReduceMean", ["c", "axes"], ["m"], name="mean", keepdims=0),
             helper.make_node("Gemm", ["m", "fc", "fb"], ["g"], name="fc"),
             helper.make_node("Softmax", ["g"], ["y"], name="softmax", axis=-1)]
    model = model_of(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 5]}, inits)
    check_fp(model, {"x": rand([1, 3, 8, 8], 1)}, atol=1e-5)
    lowered, _ = check_int(model, calib("x", [1, 3, 8, 8]), {"x": rand([1, 3, 8, 8], 2)})
    assert "TRANSPOSE" not in tosa_ops(lowered)
    all_on_npu(lowered)
    npu_bitexact(lowered)


def test_attention_block_chain():
    """q k^T -> Softmax -> @ v -> LayerNormalization, both MatMuls on activations, as one head of a transformer."""
    rng = np.random.default_rng(0)
    s, d = 8, 16
    inits = {f"w{n}": rng.normal(0, 0.25, (d, d)).astype(np.float32) for n in "qkv"}
    inits.update({"g": rng.uniform(0.5, 1.5, d).astype(np.float32), "b": rng.normal(0, 0.1, d).astype(np.float32),
                  "scale": np.array(0.25, np.float32)})
    nodes = [helper.make_node("MatMul", ["x", f"w{n}"], [n], name=f"proj_{n}") for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["qk"], name="scores"),
              helper.make_node("Mul", ["qk", "scale"], ["qks"], name="scaled"),
              helper.make_node("Softmax", ["qks"], ["att"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["att", "v"], ["o"], name="context"),
              helper.make_node("LayerNormalization", ["o", "g", "b"], ["y"], name="ln", axis=-1)]
    model = model_of(nodes, {"x": [1, s, d]}, {"y": [1, s, d]}, inits)
    check_fp(model, {"x": rand([1, s, d], 1)}, atol=1e-4)
    # onnxruntime's optimised session fuses DQ-Softmax-Q into QLinearSoftmax, which rounds as if the output
    # scale were 1/256 (up to ~1.2 LSB off), and later layers amplify that; against the QDQ semantics this
    # block measured bit-exact.
    err = errors_vs_unfused_qdq(model, "x", [1, s, d], 1.0, seeds=(2, 3))
    print(f"attention block: max error {err.max()} LSB")
    assert err.max() <= 1
    all_on_npu(lower_model(quantize_model(model, calib("x", [1, s, d])), "int"))
