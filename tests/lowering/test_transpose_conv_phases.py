"""A transposed conv whose kernel equals its stride as a 1x1 conv of its phases plus a depth-to-space shuffle
(LoweringOptions.transpose_conv_phases, U55 and U65): the same integers as TRANSPOSE_CONV2D, checked against
onnxruntime, the portable lowering, Vela's cycles and npu-sim. Vela 5.2 leaves the per-channel RESCALE after a
TRANSPOSE_CONV2D unfused (an int32 MUL, 32 cycles an element on U55-128): a U-Net's 2x2 / 2 upsample between
convs, 16x16x16 -> 32x32x8, took 0.568 ms on U55-128 and takes 0.075."""

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


def upsample(kernel=(2, 2), stride=(2, 2), cin: int = 16, cout: int = 8, size: int = 16, group: int = 1,
             pads=(0, 0, 0, 0)) -> onnx.ModelProto:
    """Conv -> Relu -> ConvTranspose -> Relu: the upsampling step of a U-Net decoder."""
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((cin, 4, 3, 3)).astype(np.float32) * 0.3
    wt = rng.standard_normal((cin, cout // group, *kernel)).astype(np.float32) * 0.3
    bt = rng.standard_normal(cout).astype(np.float32) * 0.1
    oh = (size - 1) * stride[0] + kernel[0] - pads[0] - pads[2]
    ow = (size - 1) * stride[1] + kernel[1] - pads[1] - pads[3]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ConvTranspose", ["r", "wt", "bt"], ["t"], kernel_shape=list(kernel), strides=list(stride),
                              group=group, pads=list(pads)),
             helper.make_node("Relu", ["t"], ["y"])]
    return model_of(nodes, {"x": [1, 4, size, size]}, {"y": [1, cout, oh, ow]}, {"w0": w0, "wt": wt, "bt": bt})


def _feeds(size: int = 16) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).uniform(-1, 1, (1, 4, size, size)).astype(np.float32)}


@pytest.mark.parametrize("family,target", [("u55", "ethos-u55-128"), ("u65", "ethos-u65-256")])
def test_phases_same_integers_as_the_transposed_conv_and_faster(family, target):
    model = upsample()
    cal = calib("x", [1, 4, 16, 16])
    phases, worst = check_int(model, cal, _feeds(), options=FAMILY_OPTIONS[family])
    assert worst <= 1
    whole = lower_model(quantize_model(model, cal), "int", options=replace(FAMILY_OPTIONS[family],
                                                                             transpose_conv_phases=False))
    assert "TRANSPOSE_CONV2D" in ops(whole) and "TRANSPOSE_CONV2D" not in ops(phases)
    assert ops(phases).count("CONV2D") == 2 and "TRANSPOSE" in ops(phases)
    assert_same_reference(whole, phases)
    assert vela_run(phases.tosa, target).cycles < vela_run(whole.tosa, target).cycles


@pytest.mark.parametrize("kernel", [(3, 3), (1, 2)])
def test_a_stride_u55_has_no_transposed_conv_for_runs_as_phases(kernel):
    """U55 runs TRANSPOSE_CONV2D at stride 2x2 only (Vela refuses stride 3 and 1x2): as phases it runs."""
    model = upsample(kernel, kernel)
    cal = calib("x", [1, 4, 16, 16])
    phases, worst = check_int(model, cal, _feeds(), options=FAMILY_OPTIONS["u55"])
    assert worst <= 1 and "TRANSPOSE_CONV2D" not in ops(phases)
    whole = lower_model(quantize_model(model, cal), "int")
    assert_same_reference(whole, phases)
    assert vela_run(phases.tosa, "ethos-u55-128").cycles > 0
    with pytest.raises(AssertionError, match="could not run on NPU"):
        vela_run(whole.tosa, "ethos-u55-128")


def test_npu_sim_runs_the_phases_form_bit_exact():
    phases, _ = check_int(upsample(), calib("x", [1, 4, 16, 16]), _feeds(), options=FAMILY_OPTIONS["u55"])
    with tempfile.TemporaryDirectory() as tmp:
        npz = vela_raw(phases.tosa, Path(tmp), "ethos-u55-128")
        assert_bitexact(phases.tosa, io_dict(phases), npz)


@pytest.mark.parametrize("kwargs", [{"kernel": (3, 3), "stride": (2, 2)},
                                    {"pads": (1, 1, 1, 1), "kernel": (4, 4), "stride": (2, 2)}])
def test_overlapping_taps_or_cropping_keep_the_transposed_conv(kwargs):
    model = upsample(**kwargs)
    lowered, worst = check_int(model, calib("x", [1, 4, 16, 16]), _feeds(), options=FAMILY_OPTIONS["u55"])
    assert "TRANSPOSE_CONV2D" in ops(lowered) and worst <= 1


def test_u85_keeps_the_transposed_conv():
    """U85-256 runs the TRANSPOSE_CONV2D's RESCALE cheaply: the phases form measured 0.056 -> 0.076 ms there."""
    assert not FAMILY_OPTIONS["u85"].transpose_conv_phases
    lowered, _ = check_int(upsample(), calib("x", [1, 4, 16, 16]), _feeds(), options=FAMILY_OPTIONS["u85"])
    assert "TRANSPOSE_CONV2D" in ops(lowered)
