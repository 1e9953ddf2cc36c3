"""A conv whose kernel is its stride, stride 4 and up (ConvNeXt's and a ViT's patch embedding), as a 1x1 conv
of the input's patch view (space_to_depth.patch_view, every family): the same integers, checked against
onnxruntime, the portable lowering, Vela's cycles and npu-sim. Vela 5.2 runs a stride past 3 as one small conv
per output position: the export_zoo ConvNeXt block took 1.548 ms on U55-128 and takes 0.373 (U65-256
0.418 -> 0.142, U85-256 0.467 -> 0.139)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.lowering import model_of
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, vela_run
from onnx import helper

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa


def patch_stem(patch: int = 4, size: int = 32, pads=(0, 0, 0, 0)) -> onnx.ModelProto:
    """Conv 3 -> 16 with kernel = stride = patch -> Relu -> 1x1 conv."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 3, patch, patch)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((8, 16, 1, 1)).astype(np.float32) * 0.3
    out = (size + pads[0] + pads[2] - patch) // patch + 1
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[patch, patch], strides=[patch, patch],
                              pads=list(pads)),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Conv", ["r", "w2"], ["y"])]
    return model_of(nodes, {"x": [1, 3, size, size]}, {"y": [1, 8, out, out]}, {"w": w, "w2": w2})


def _feeds(size: int = 32) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).uniform(-1, 1, (1, 3, size, size)).astype(np.float32)}


def assert_same_integers(a, b) -> None:
    """Both graphs' raw outputs on the same ONNX-layout inputs (U65 reads a 3-channel input planar: each graph
    is fed in its own layout, through its IOSpecs)."""
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)}
        ya, yb = run_tosa(a.tosa, a, feeds), run_tosa(b.tosa, b, feeds)
        assert all(np.array_equal(ya[k], yb[k]) for k in ya), seed


def _conv_strides(tosa: bytes) -> list[list[int]]:
    return [op.attr.get("stride") for op in read_tosa(tosa).ops if op.op == "CONV2D"]


@pytest.mark.parametrize("family,target", [("u55", "ethos-u55-128"), ("u65", "ethos-u65-256"),
                                           ("u85", "ethos-u85-256")])
@pytest.mark.parametrize("patch", [4, 8])
def test_patch_view_same_integers_and_faster(family, target, patch):
    model, cal = patch_stem(patch), calib("x", [1, 3, 32, 32])
    patched, worst = check_int(model, cal, _feeds(), options=FAMILY_OPTIONS[family])
    assert worst <= 1 and _conv_strides(patched.tosa) == [[1, 1], [1, 1]]
    portable = lower_model(quantize_model(model, cal), "int")
    assert _conv_strides(portable.tosa)[0] == [patch, patch]
    assert_same_integers(portable, patched)
    assert vela_run(patched.tosa, target).cycles < vela_run(portable.tosa, target).cycles


def test_npu_sim_runs_the_patch_view_bit_exact():
    patched, _ = check_int(patch_stem(), calib("x", [1, 3, 32, 32]), _feeds(), options=FAMILY_OPTIONS["u55"])
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(patched.tosa, io_dict(patched), vela_raw(patched.tosa, Path(tmp), "ethos-u55-128"))


@pytest.mark.parametrize("patch, pads", [(2, (0, 0, 0, 0)), (4, (1, 1, 1, 1))])
def test_a_small_stride_or_a_padded_patch_keeps_the_strided_conv(patch, pads):
    lowered, worst = check_int(patch_stem(patch, pads=pads), calib("x", [1, 3, 32, 32]), _feeds(),
                               options=FAMILY_OPTIONS["u55"])
    assert worst <= 1 and _conv_strides(lowered.tosa)[0] == [patch, patch]
