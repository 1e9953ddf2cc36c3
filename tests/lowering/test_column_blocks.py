"""A conv strided past 3 along W whose kernel is not its stride (an STFT as a conv: openWakeWord's melspectrogram,
two 257 x 512 filters at hop 160 over 1760 samples) as a stride-1 conv of the input's W-block view
(space_to_depth.column_blocks, every family): the same integers as the strided conv, checked against onnxruntime,
the portable lowering, Vela's cycles and npu-sim. Vela 5.2 runs a stride past 3 as one conv per output position
on a one-channel input: the melspectrogram took 2.54 M cycles on U55-128 and takes 0.24 M."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from npbtest.lowering import model_of, npu_bitexact
from npbtest.ops import calib, check_int, quantize_model, quantize_model16, vela_run
from onnx import helper

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.lowering.space_to_depth import _column_blocks
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa


def stft_conv(length: int = 400, k: int = 64, s: int = 20, cin: int = 1, out_ch: int = 24,
              pads=(0, 0), one_d: bool = True) -> onnx.ModelProto:
    """Conv (cin -> out_ch, kernel k, stride s along the samples) -> Mul by itself (a power), as a 1-D conv on
    [1, cin, length] or a 2-D one on [1, cin, 1, length]."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((out_ch, cin, k)) * 0.15).astype(np.float32)
    out = (length + pads[0] + pads[1] - k) // s + 1
    if one_d:
        conv = helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[k], strides=[s], pads=list(pads))
        x_shape, y_shape = [1, cin, length], [1, out_ch, out]
    else:
        w = w[:, :, None, :]
        conv = helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, k], strides=[1, s],
                                pads=[0, pads[0], 0, pads[1]])
        x_shape, y_shape = [1, cin, 1, length], [1, out_ch, 1, out]
    return model_of([conv, helper.make_node("Mul", ["c", "c"], ["y"])], {"x": x_shape}, {"y": y_shape}, {"w": w})


def _feeds(shape, seed: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)}


def _conv_strides(tosa: bytes) -> list[list[int]]:
    return [op.attr.get("stride") for op in read_tosa(tosa).ops if op.op == "CONV2D"]


def _assert_same_integers(a, b, shape) -> None:
    for seed in range(3):
        feeds = _feeds(shape, seed)
        ya, yb = run_tosa(a.tosa, a, feeds), run_tosa(b.tosa, b, feeds)
        assert all(np.array_equal(ya[k], yb[k]) for k in ya), seed


@pytest.mark.parametrize("family,target", [("u55", "ethos-u55-128"), ("u65", "ethos-u65-256"),
                                           ("u85", "ethos-u85-256")])
def test_stft_conv_same_integers_and_faster(family, target):
    model, shape = stft_conv(), [1, 1, 400]
    blocked, worst = check_int(model, calib("x", shape), _feeds(shape), options=FAMILY_OPTIONS[family])
    assert worst <= 1 and _conv_strides(blocked.tosa) == [[1, 1]]
    portable = lower_model(quantize_model(model, calib("x", shape)), "int")
    assert _conv_strides(portable.tosa) == [[1, 20]]
    _assert_same_integers(portable, blocked, shape)
    assert vela_run(blocked.tosa, target).cycles < vela_run(portable.tosa, target).cycles / 2


@pytest.mark.parametrize("pads,cin,one_d", [((0, 0), 3, True), ((30, 30), 1, True), ((7, 0), 2, False),
                                            ((0, 13), 1, False)])
def test_pads_and_channels_keep_the_integers(pads, cin, one_d):
    """A left pad that is not a whole block shifts the kernel in its grid; a right pad the taps read is zero-point
    blocks; several channels interleave by column phase."""
    model = stft_conv(length=400, cin=cin, pads=pads, one_d=one_d)
    shape = [1, cin, 400] if one_d else [1, cin, 1, 400]
    blocked, worst = check_int(model, calib("x", shape), _feeds(shape), options=FAMILY_OPTIONS["u55"])
    assert worst <= 1 and _conv_strides(blocked.tosa) == [[1, 1]]
    _assert_same_integers(lower_model(quantize_model(model, calib("x", shape)), "int"), blocked, shape)


def test_int16_activations_keep_the_integers():
    model, shape = stft_conv(), [1, 1, 400]
    qdq = quantize_model16(model, calib("x", shape))
    blocked = lower_model(qdq, "int", options=FAMILY_OPTIONS["u55"])
    assert _conv_strides(blocked.tosa) == [[1, 1]]
    _assert_same_integers(lower_model(qdq, "int"), blocked, shape)


def test_npu_sim_runs_the_block_view_bit_exact():
    model, shape = stft_conv(pads=(7, 0)), [1, 1, 400]
    blocked, _ = check_int(model, calib("x", shape), _feeds(shape), options=FAMILY_OPTIONS["u55"])
    npu_bitexact(blocked)


def test_a_read_partial_last_block_keeps_the_strided_conv():
    """401 samples, stride 20, kernel 41: the last output reads sample 400, in a block of one column."""
    model, shape = stft_conv(length=401, k=41), [1, 1, 401]
    lowered, worst = check_int(model, calib("x", shape), _feeds(shape), options=FAMILY_OPTIONS["u55"])
    assert worst <= 1 and _conv_strides(lowered.tosa) == [[1, 20]]


@pytest.mark.parametrize("w,k,s,before,after", [(1760, 512, 160, 0, 0), (400, 64, 20, 30, 30), (400, 64, 20, 7, 0),
                                                (401, 41, 20, 0, 0), (100, 9, 4, 4, 4), (37, 5, 6, 2, 0)])
def test_block_geometry_reads_what_the_conv_reads(w, k, s, before, after):
    """Every tap of every output lands on the same input column (or on padding) in the block domain."""
    cols = _column_blocks(w, k, s, before, after)
    out = (w - 1 + before + after - (k - 1)) // s + 1
    reads_partial = min((out - 1) * s + k - 1 - before, w - 1) >= (w // s) * s
    assert (cols is None) == reads_partial
    if cols is None:
        return
    assert cols.before + cols.blocks + cols.after == out - 1 + cols.kernel
    for o in range(out):
        for j in range(k):
            col = o * s + j - before  # ONNX: the input column (outside [0, w): padding)
            block, phase = divmod(j + cols.shift, s)
            view = (o + block - cols.before) * s + phase  # the column the block view reads
            if 0 <= col < w:
                assert view == col < cols.blocks * s
            else:
                assert not 0 <= view < cols.blocks * s
