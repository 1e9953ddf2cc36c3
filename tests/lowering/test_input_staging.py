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
from npusim_helpers import assert_bitexact, vela_raw
from onnx import TensorProto, helper
from ophelpers import calib, check_int, io_dict, quantize_model, vela_run
from test_depthwise_requantize import assert_same_reference, ops

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS


def _first_conv(channels: int, h: int, w: int) -> onnx.ModelProto:
    """An image stem: 3x3 stride-2 conv to 16 channels, then Relu."""
    wt = np.random.default_rng(0).standard_normal((16, channels, 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, h // 2, w // 2])],
                              [onnx.numpy_helper.from_array(wt, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _direct(family: str):
    return replace(FAMILY_OPTIONS[family], staged_input_min_row=0)


@pytest.mark.parametrize("family,target", [("u85", "ethos-u85-256"), ("u85wide", "ethos-u85-1024")])
def test_staged_input_same_integers_and_faster(family, target):
    shape = [1, 3, 96, 96]
    model = _first_conv(3, 96, 96)
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
    assert 0 <= extra <= 3 * 96 * 96 / 1024


def test_staged_input_bitexact_on_npusim():
    qdq = quantize_model(_first_conv(3, 64, 64), calib("x", [1, 3, 64, 64]))
    staged = lower_model(qdq, "int", family="u85")
    assert "MAXIMUM" in ops(staged)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(staged.tosa, io_dict(staged), vela_raw(staged.tosa, Path(tmp), "ethos-u85-256"))


@pytest.mark.parametrize("family,chw", [("u85", (3, 32, 32)), ("u85", (1, 64, 64)), ("u85", (8, 64, 64)),
                                        ("u55", (3, 96, 96)), ("u65", (3, 96, 96))])
def test_short_rows_wide_inputs_and_other_families_read_directly(family, chw):
    """Rows under 128 bytes (32x32x3: slower on U85-128 and U85-1024; 1-channel inputs slower everywhere), 8
    channels (full bricks), and U55/U65 (the input is in SRAM on Shared_Sram; U65 keeps it planar) are not
    staged."""
    c, h, w = chw
    qdq = quantize_model(_first_conv(c, h, w), calib("x", [1, c, h, w]))
    lowered = lower_model(qdq, "int", family=family)
    assert "MAXIMUM" not in ops(lowered)
    assert lowered.tosa == lower_model(qdq, "int", options=_direct(family)).tosa
