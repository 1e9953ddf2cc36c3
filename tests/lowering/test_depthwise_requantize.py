"""U55/U65 lowering of int8->int8 requantisation as a 1x1 depthwise conv of ones (emit.requantize).

The depthwise form must be bit-identical to the RESCALE form (TOSA reference model and npu-sim) and
cheaper on U55-128, where the lowering takes it for every shape; where U65-256 would run it slower (wide
channels, small planes), U65 keeps RESCALE.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import pytest
from npbtest.lowering import assert_same_reference, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, io_dict, quantize_model, single_op_model, vela_run

from npubuild.lowering.driver import lower_model

ROOT = Path(__file__).resolve().parents[2]


def concat_model(shape: list[int]) -> onnx.ModelProto:
    """Concat of two inputs calibrated to different ranges: `a` is requantised to the output's (b's) scale."""
    m = single_op_model("Concat", {"a": shape, "b": shape}, {"y": None}, axis=1)
    cal = {**calib("a", shape, seed=1), "b": calib("b", shape, seed=2)["b"] * 3.0 + 0.5}
    return quantize_model(m, cal)


def test_depthwise_requantize_identical_and_faster_on_u55():
    qdq = concat_model([1, 8, 32, 32])
    portable, u55 = lower_model(qdq, "int"), lower_model(qdq, "int", family="u55")
    assert ops(portable) == ["RESCALE", "CONCAT"]
    assert ops(u55) == ["DEPTHWISE_CONV2D", "RESCALE", "CONCAT"]
    assert_same_reference(portable, u55)
    assert vela_run(u55.tosa, "ethos-u55-128").cycles < vela_run(portable.tosa, "ethos-u55-128").cycles
    assert vela_run(u55.tosa, "ethos-u65-256").cycles < vela_run(portable.tosa, "ethos-u65-256").cycles
    assert lower_model(qdq, "int", family="u85").tosa == portable.tosa


def test_depthwise_requantize_bitexact_on_npusim():
    qdq = concat_model([1, 8, 16, 16])
    u55 = lower_model(qdq, "int", family="u55")
    assert "DEPTHWISE_CONV2D" in ops(u55)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(u55.tosa, io_dict(u55), vela_raw(u55.tosa, Path(tmp), "ethos-u55-128"))


@pytest.mark.parametrize("shape", [[1, 32, 16, 16], [1, 8, 4, 4]])
def test_rescale_kept_on_u65_where_depthwise_is_slower_there(shape):
    """Wide channels or small planes: U65 keeps RESCALE, and U55's depthwise form is indeed slower on U65-256;
    U55 takes it there too, faster on U55-128."""
    qdq = concat_model(shape)
    portable = lower_model(qdq, "int")
    assert lower_model(qdq, "int", family="u65").tosa == portable.tosa
    u55 = lower_model(qdq, "int", family="u55")
    assert "DEPTHWISE_CONV2D" in ops(u55)
    assert_same_reference(portable, u55)
    assert vela_run(u55.tosa, "ethos-u55-128").cycles < vela_run(portable.tosa, "ethos-u55-128").cycles
    assert vela_run(u55.tosa, "ethos-u65-256").cycles > vela_run(portable.tosa, "ethos-u65-256").cycles
