"""npu-sim on what Vela builds for U85 from single ONNX layers (quantised, lowered by npubuild): each bit-exact
against the TOSA reference model. Most run on U85-256; a cross-section also on every other size, where the
core count (weight streams), micro-blocks and the u85wide lowering family change."""

from __future__ import annotations

import numpy as np
import pytest
from npbtest.npusim import compile_and_check
from npbtest.ops import rand, single_op_model

S = [1, 16, 8, 8]


def conv(cin: int, cout: int, k: int, size: int, stride: int = 1, dilation: int = 1, group: int = 1):
    pad = (k // 2) * dilation
    w = rand((cout, cin // group, k, k), 7, -0.5, 0.5)
    m = single_op_model("Conv", {"x": [1, cin, size, size]}, {"y": None}, {"w": w, "b": rand((cout,), 8)},
                        pads=[pad] * 4, strides=[stride, stride], dilations=[dilation, dilation], group=group)
    return m, [1, cin, size, size]


def _resize(scales, **attrs):
    return single_op_model("Resize", {"x": S}, {"y": None}, {"roi": np.zeros(0, np.float32),
                           "scales": np.array(scales, np.float32)}, **attrs), S


def _one(op: str, *extra, shape=S, **attrs):
    inputs = {"x": shape, **{f"x{i + 2}": s for i, s in enumerate(extra)}}
    return single_op_model(op, inputs, {"y": None}, **attrs), shape


def _axes(op: str, axis: int, opset: int = 18):
    return single_op_model(op, {"x": S}, {"y": None}, {"axes": np.array([axis], np.int64)}, opset=opset), S


CASES = {
    # convolutions: sub-kernel decomposition (k9), stride 3, dilation, several IFM blocks (200 in), OFM blocks
    "conv_k1": conv(16, 24, 1, 12), "conv_k3s2": conv(8, 16, 3, 12, 2), "conv_k7s2": conv(4, 8, 7, 12, 2),
    "conv_k9": conv(4, 8, 9, 14), "conv_s3": conv(8, 16, 3, 13, 3), "conv_d2": conv(8, 8, 3, 12, 1, 2),
    "conv_200_70": conv(200, 70, 3, 6), "conv_130_130_k1": conv(130, 130, 1, 5),
    "dw_k3s2": conv(24, 24, 3, 11, 2, group=24), "dw_k5": conv(24, 24, 5, 11, group=24),
    "dw_d2": conv(24, 24, 3, 11, 1, 2, group=24), "dw_k9": conv(16, 16, 9, 12, group=16),
    "dw_multiplier2": conv(8, 16, 3, 9, group=8), "dw_70": conv(70, 70, 3, 7, group=70),
    "conv_transpose": (single_op_model("ConvTranspose", {"x": S}, {"y": None}, {"w": rand((16, 8, 3, 3), 3),
                       "b": rand((8,), 4)}, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), S),
    "gemm": (single_op_model("Gemm", {"x": [1, 64]}, {"y": None}, {"w": rand((10, 64), 3), "b": rand((10,), 4)},
                             transB=1), [1, 64]),
    "matmul_batched": _one("MatMul", [2, 3, 16, 8], shape=[2, 3, 4, 16]),
    # resize: the RESIZE op's modes, scales and coordinate modes
    "resize_nearest_2x": _resize([1, 1, 2, 2], mode="nearest"),
    "resize_nearest_half": _resize([1, 1, 0.5, 0.5], mode="nearest"),
    "resize_bilinear_2x": _resize([1, 1, 2, 2], mode="linear"),
    "resize_bilinear_3x": _resize([1, 1, 3, 3], mode="linear"),
    "resize_bilinear_align_corners": _resize([1, 1, 2, 2], mode="linear", coordinate_transformation_mode="align_corners"),
    # pooling: AVERAGE (window <= 8x8, padding), SUM (larger windows), MAX, MIN/MAX reductions per axis
    "avgpool_padded": (single_op_model("AveragePool", {"x": S}, {"y": None}, kernel_shape=[3, 3], pads=[1] * 4,
                       count_include_pad=0), S),
    "maxpool_s2": (single_op_model("MaxPool", {"x": S}, {"y": None}, kernel_shape=[3, 3], strides=[2, 2],
                   pads=[1] * 4), S),
    "global_avg_12x12": _one("GlobalAveragePool", shape=[1, 16, 12, 12]),
    "global_max": _one("GlobalMaxPool"),
    "reduce_mean_c": _axes("ReduceMean", 1), "reduce_sum_c": _axes("ReduceSum", 1, 13),
    "reduce_max_w": _axes("ReduceMax", 3), "reduce_min_h": _axes("ReduceMin", 2),
    # elementwise with broadcast and scalars; activations as LUTs
    "add": _one("Add", S), "sub": _one("Sub", S), "mul": _one("Mul", S), "min": _one("Min", S),
    "add_broadcast_c": _one("Add", [1, 16, 1, 1]), "add_broadcast_hw": _one("Add", [1, 1, 8, 8]),
    "mul_broadcast_w": _one("Mul", [1, 16, 8, 1]),
    "add_scalar": (single_op_model("Add", {"x": S}, {"y": None}, {"c": np.array(0.3, np.float32)}), S),
    "div_scalar": (single_op_model("Div", {"x": S}, {"y": None}, {"c": np.array(3.0, np.float32)}), S),
    "leaky_relu": _one("LeakyRelu", alpha=0.1),
    "prelu": (single_op_model("PRelu", {"x": S}, {"y": None}, {"s": rand((16, 1, 1), 2, 0, 0.3)}), S),
    "prelu_signed": (single_op_model("PRelu", {"x": S}, {"y": None}, {"s": rand((16, 1, 1), 2, -1.5, 2.5)}), S),
    "hardswish": _one("HardSwish"), "sigmoid": _one("Sigmoid"), "tanh": _one("Tanh"), "exp": _one("Exp"),
    "gelu": (single_op_model("Gelu", {"x": S}, {"y": None}, opset=20), S), "sqrt": _one("Sqrt"),
    "softmax_rows": _one("Softmax", shape=[2, 6, 16], axis=-1), "log_softmax": _one("LogSoftmax", shape=[1, 10]),
    "layer_norm": (single_op_model("LayerNormalization", {"x": [1, 6, 16]}, {"y": None},
                                   {"g": rand((16,), 3), "b": rand((16,), 4)}, axis=-1), [1, 6, 16]),
    "instance_norm": (single_op_model("InstanceNormalization", {"x": S}, {"y": None},
                                      {"g": rand((16,), 3), "b": rand((16,), 4)}), S),
    # data movement
    "concat_w": _one("Concat", S, axis=3),
    "pad": (single_op_model("Pad", {"x": S}, {"y": None}, {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}), S),
    "slice_strided": (single_op_model("Slice", {"x": S}, {"y": None}, {"s": np.array([1, 2], np.int64),
                      "e": np.array([7, 6], np.int64), "a": np.array([2, 3], np.int64)}), S),
    "gather_constant_indices": (single_op_model("Gather", {"x": [1, 10, 16]}, {"y": None},
                                                {"i": np.array([3, 1, 7, 7], np.int64)}, axis=1), [1, 10, 16]),
}
OTHER_SIZES = ["conv_200_70", "dw_k5", "dw_multiplier2", "matmul_batched", "resize_bilinear_2x", "softmax_rows"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_u85_256_bitexact(name):
    compile_and_check(*CASES[name], "ethos-u85-256")


@pytest.mark.parametrize("accelerator", ["ethos-u85-128", "ethos-u85-512", "ethos-u85-1024", "ethos-u85-2048"])
@pytest.mark.parametrize("name", OTHER_SIZES)
def test_other_u85_sizes_bitexact(name, accelerator):
    compile_and_check(*CASES[name], accelerator)


def test_size_optimised_builds_bitexact():
    for accelerator in ("ethos-u85-256", "ethos-u85-2048"):
        compile_and_check(*CASES["conv_200_70"], accelerator, "--optimise", "Size")
        compile_and_check(*CASES["dw_k5"], accelerator, "--optimise", "Size")
