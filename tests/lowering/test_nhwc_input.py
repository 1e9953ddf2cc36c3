"""An NHWC image input transposed to NCHW by the model itself (tf2onnx and onnx2tf exports, a torch permute).

The lowering lays an NCHW graph input out as NHWC; an input that is already NHWC, read only by a Transpose
(0, 3, 1, 2), is laid out as it is (LoweringContext.nhwc_image): the Transpose moves no byte, and U85's
input staging (lowering/input_staging.py) copies it as it would an NCHW image. U65, which reads a narrow
image planar, keeps its own form. MobileNetV1 with an NHWC input, before -> after: U55-128 0.762 -> 0.721 ms,
U85-256 0.257 -> 0.186 ms and 180.8 -> 72.75 KiB SRAM (the NCHW model's figures to the digit).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import compile_builds
from npbtest.lowering import model_of, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_int, io_dict
from onnx import helper

from npubuild.lowering.options import FAMILY_OPTIONS

H = W = 64  # a 192-byte row: U85 stages it (staged_input_min_row)


def nhwc_conv(extra_reader: bool = False) -> onnx.ModelProto:
    """x [1, 32, 32, 3] (NHWC) -> Transpose to NCHW -> 3x3 stride-2 conv, 16 channels -> Relu."""
    w = np.random.default_rng(0).standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Transpose", ["x"], ["nchw"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["nchw", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["y"])]
    outputs = {"y": [1, 16, H // 2, W // 2]}
    if extra_reader:  # the input read as NHWC too: its layout must serve both
        nodes.append(helper.make_node("Relu", ["x"], ["x_relu"]))
        outputs["x_relu"] = [1, H, W, 3]
    return model_of(nodes, {"x": [1, H, W, 3]}, outputs, {"w": w})


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).uniform(-1, 1, (1, H, W, 3)).astype(np.float32)}


@pytest.mark.parametrize("family", ["u55", "u85"])
def test_the_nhwc_input_is_laid_out_as_it_is_and_the_transpose_emits_nothing(family):
    lowered, _ = check_int(nhwc_conv(), calib("x", [1, H, W, 3]), _feeds(), options=FAMILY_OPTIONS[family])
    (spec,) = lowered.inputs
    assert spec.perm == (0, 1, 2, 3) and spec.shape == (1, H, W, 3)
    assert "TRANSPOSE" not in ops(lowered)
    if family == "u85":  # staged into SRAM as long rows, as an NCHW image's NHWC bytes are
        assert ops(lowered)[0] == "RESHAPE" and "MAXIMUM" in ops(lowered)


def test_npu_sim_runs_the_compiled_nhwc_input_bit_exact():
    lowered, _ = check_int(nhwc_conv(), calib("x", [1, H, W, 3]), _feeds(), options=FAMILY_OPTIONS["u85"])
    with tempfile.TemporaryDirectory() as tmp:
        npz = vela_raw(lowered.tosa, Path(tmp), "ethos-u85-256")
        assert_bitexact(lowered.tosa, io_dict(lowered), npz)


@pytest.mark.parametrize("family", ["u65", "u55"])
def test_a_second_reader_or_u65s_planar_image_keeps_the_default_layout(family):
    extra = family == "u55"
    lowered, _ = check_int(nhwc_conv(extra_reader=extra), calib("x", [1, H, W, 3]), _feeds(),
                           options=FAMILY_OPTIONS[family])
    assert lowered.inputs[0].perm != (0, 1, 2, 3)


def test_a_torch_style_nhwc_model_builds_with_no_transpose(tmp_path: Path, capsys):
    path = tmp_path / "nhwc.onnx"
    onnx.save(nhwc_conv(), path)
    builds = compile_builds(path, ["ethos-u55-128", "ethos-u85-256"], tmp_path / "b", capsys)
    assert [b["status"] for b in builds] == ["passed", "passed"]
    assert all(b["metrics"]["transposes"] == 0 and b["metrics"]["tosa_max_error_lsb"] <= 1 for b in builds)
