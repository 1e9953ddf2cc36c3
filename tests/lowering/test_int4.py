"""8x4 lowering forms: 4-bit weights (EXT-INT4) for convolutions, depthwise and fully connected layers, as
npubuild's precision rewrite makes them (per channel, symmetric in [-7, 7]): within 1 LSB of the QDQ model on the
TOSA reference model, compiled by Vela for U55 and U85 into fewer weight bytes than the int8 weights of the same
layer, bit-exact in npu-sim. onnxruntime's own QInt4 weights (which reach -8) are lowered too, -8 kept in int8."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_qdq, io_dict, quantize_model, quantize_model16, rand, single_op_model

from npubuild.frontend.precision.qdq import QdqModel
from npubuild.frontend.precision.rewrite import PrecisionPlan, apply_plan
from npubuild.npusim.npz import load_raw


def _w(shape, seed=0):
    return np.random.default_rng(seed).normal(0, 0.3, shape).astype(np.float32)


CASES = {
    "conv": (lambda: single_op_model("Conv", {"x": [1, 16, 8, 8]}, {"y": None}, {"w": _w((32, 16, 3, 3)), "b": _w((32,), 1)},
                                     pads=[1, 1, 1, 1]), [1, 16, 8, 8]),
    "depthwise": (lambda: single_op_model("Conv", {"x": [1, 16, 8, 8]}, {"y": None}, {"w": _w((16, 1, 3, 3)), "b": _w((16,), 1)},
                                          pads=[1, 1, 1, 1], group=16), [1, 16, 8, 8]),
    "fully_connected": (lambda: single_op_model("Gemm", {"x": [1, 64]}, {"y": None}, {"w": _w((48, 64)), "b": _w((48,), 1)},
                                                transB=1), [1, 64]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_int4_weights(name):
    build, shape = CASES[name]
    cal, feeds = calib("x", shape), {"x": rand(shape, 3)}
    sizes = {}
    int8 = quantize_model(build(), cal)
    for weights in ("int4", "int8"):
        qdq = apply_plan(int8, PrecisionPlan(int4=frozenset(QdqModel(int8).layers)), ("u55", "u85")) \
            if weights == "int4" else int8
        for family, accel in (("u55", "ethos-u55-128"), ("u85", "ethos-u85-256")):
            lowered, _ = check_qdq(qdq, feeds, max_lsb=1.0, family=family)
            with tempfile.TemporaryDirectory() as tmp:
                npz = vela_raw(lowered.tosa, Path(tmp), accel)
                if weights == "int4":
                    assert_bitexact(lowered.tosa, io_dict(lowered), npz, seeds=(0,))
                sizes[weights, accel] = len(load_raw(npz).weights)  # the constants Vela stores
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        assert sizes["int4", accel] < sizes["int8", accel], sizes


def test_onnxruntime_int4_weights():
    """onnxruntime's QInt4 (contrib Q/DQ before opset 21, weights down to -8) lowers within 1 LSB of its model."""
    build, shape = CASES["conv"]
    qdq = quantize_model16(build(), calib("x", shape), weights="int4", activations="int8")
    check_qdq(qdq, {"x": rand(shape, 3)}, max_lsb=1.0, family="u85")


def test_int4_weights_under_int16_activations():
    """16x4 has no TOSA form: 4-bit weights under a 16-bit activation are stored as the same integers in int8."""
    build, shape = CASES["conv"]
    qdq = quantize_model16(build(), calib("x", shape), weights="int4", activations="int16")
    lowered, _ = check_qdq(qdq, {"x": rand(shape, 3)}, max_lsb=1.0, family="u55")
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), "ethos-u55-128"), seeds=(0,))
