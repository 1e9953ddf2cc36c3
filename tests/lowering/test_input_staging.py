"""U85: a 3-channel image input copied into SRAM as long rows before the first conv (lowering/input_staging.py).

The copy (an elementwise MAXIMUM of the input with itself, viewed as [N, H, 1, W*C]) must give the same
integers as reading the input directly (TOSA reference model and npu-sim) and be faster on U85, where the
first conv otherwise reads the DRAM input a few bytes per burst; narrow inputs and other families keep the
direct read.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.lowering import assert_same_reference, model_of, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, vela_run
from onnx import helper

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS


def _first_conv(channels: int, h: int, w: int, stride: int = 2) -> onnx.ModelProto:
    """An image stem: 3x3 conv (padded by 1) to 16 channels, then Relu."""
    wt = np.random.default_rng(0).standard_normal((16, channels, 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], strides=[stride, stride],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    oh, ow = (h - 1) // stride + 1, (w - 1) // stride + 1
    return model_of(nodes, {"x": [1, channels, h, w]}, {"y": [1, 16, oh, ow]}, {"w": wt})


def _direct(family: str):
    return replace(FAMILY_OPTIONS[family], staged_input_min_row=None)


@pytest.mark.parametrize("family,target", [("u85", "ethos-u85-256"), ("u85wide", "ethos-u85-1024")])
def test_staged_input_same_integers_and_faster(family, target):
    chw = (3, 96, 96)
    shape = [1, *chw]
    model = _first_conv(*chw)
    cal = calib("x", shape)
    staged, _ = check_int(model, cal, {"x": np.random.default_rng(5).uniform(-1, 1, shape).astype(np.float32)},
                          options=FAMILY_OPTIONS[family])
    direct = lower_model(quantize_model(model, cal), "int", options=_direct(family))
    assert "MAXIMUM" in ops(staged) and "MAXIMUM" not in ops(direct)
    assert_same_reference(direct, staged)
    fast, slow = vela_run(staged.tosa, target), vela_run(direct.tosa, target)
    assert fast.cycles < 0.9 * slow.cycles
    # the copy lives in SRAM: at most the input's bytes more (the examples' SRAM peak is elsewhere: unchanged)
    extra = float(fast.summary["sram_memory_used"]) - float(slow.summary["sram_memory_used"])
    assert 0 <= extra <= np.prod(chw) / 1024


def test_staged_input_bitexact_on_npusim():
    qdq = quantize_model(_first_conv(3, 64, 64), calib("x", [1, 3, 64, 64]))
    staged = lower_model(qdq, "int", family="u85")
    assert "MAXIMUM" in ops(staged)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(staged.tosa, io_dict(staged), vela_raw(staged.tosa, Path(tmp), "ethos-u85-256"))


@pytest.mark.parametrize("family,chw", [("u85", (3, 32, 32)), ("u85", (1, 64, 64)), ("u85", (8, 64, 64)),
                                        ("u55", (3, 96, 96)), ("u65", (3, 96, 96)), ("u65", (1, 28, 28))])
def test_short_rows_wide_inputs_and_other_families_read_directly(family, chw):
    """On U85 rows under 128 bytes (32x32x3: slower on U85-128 and U85-1024; 1-channel inputs slower) and 8
    channels (full bricks); U55 (the input is in SRAM on Shared_Sram) and U65 (slower on most stems) are not
    staged."""
    c, h, w = chw
    qdq = quantize_model(_first_conv(c, h, w), calib("x", [1, c, h, w]))
    lowered = lower_model(qdq, "int", family=family)
    assert "MAXIMUM" not in ops(lowered)
    assert lowered.tosa == lower_model(qdq, "int", options=_direct(family)).tosa


def test_no_second_copy_where_a_stride_2_conv_reads_the_space_to_depth_view():
    """With staging asked for where the stem also runs on its space-to-depth view (itself a copy into SRAM),
    the input is not staged: the second copy only costs (U65-256 28x28x1: 5568 -> 6051 cycles)."""
    qdq = quantize_model(_first_conv(1, 28, 28), calib("x", [1, 1, 28, 28]))
    both = replace(FAMILY_OPTIONS["u65"], staged_input_min_row=16)
    lowered = lower_model(qdq, "int", options=both)
    assert "MAXIMUM" not in ops(lowered) and "TRANSPOSE" in ops(lowered)
    one_stride = quantize_model(_first_conv(1, 28, 28, stride=1), calib("x", [1, 1, 28, 28]))
    assert "MAXIMUM" in ops(lower_model(one_stride, "int", options=both))


def _residual(k: int = 64, rows: int = 16) -> onnx.ModelProto:
    """x -> MatMul -> Relu -> MatMul, plus x: the graph input read again at the end (a transformer's residual)."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MatMul", ["r", "w1"], ["b"]), helper.make_node("Add", ["x", "b"], ["y"])]
    weights = {n: (rng.standard_normal((k, k)) * 0.2).astype(np.float32) for n in ("w0", "w1")}
    return model_of(nodes, {"x": [1, rows, k]}, {"y": [1, rows, k]}, weights)


@pytest.mark.parametrize("family", ["u55", "u65", "u85"])
def test_input_copy_same_integers(family):
    """LoweringOptions.input_copy (size mode's choice): every int8 graph input, of any rank, copied by a MAXIMUM
    first; the integers are the direct read's (TOSA reference model), and the copy is an exact form (the
    family's check stays bit for bit where the family's own forms are)."""
    shape = [1, 16, 64]
    model = _residual()
    cal = calib("x", shape)
    on = replace(FAMILY_OPTIONS[family], input_copy=True)
    copied, _ = check_int(model, cal, {"x": np.random.default_rng(5).uniform(-1, 1, shape).astype(np.float32)},
                          options=on)
    direct = lower_model(quantize_model(model, cal), "int", options=FAMILY_OPTIONS[family])
    assert ops(copied).count("MAXIMUM") == ops(direct).count("MAXIMUM") + 1
    assert_same_reference(direct, copied)
    assert on.exact_only() == replace(FAMILY_OPTIONS[family].exact_only(), input_copy=True)
