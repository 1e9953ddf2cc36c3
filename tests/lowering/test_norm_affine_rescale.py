"""A layer norm's affine step with no beta and no negative gamma as one RESCALE of the int16 normalised value
(LoweringOptions.norm_affine_rescale, measured per model): the depthwise form's integers for every input, on the
TOSA reference model and npu-sim, without the depthwise's per-channel constants."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from npbtest.lowering import assert_same_reference, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, io_dict, quantize_model, single_op_model

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PORTABLE

SHAPE = [24, 64]
GAMMAS = {
    "ones": np.ones(64),  # torch's default gamma 1, beta 0: no affine step at all (ops/norm._uniform_scale)
    "near ones": np.r_[np.ones(63), 1.1],
    "per channel": np.r_[0.0, np.random.default_rng(1).uniform(0.05, 3.0, 63)],  # one dead channel
}


def layer_norm_qdq(gamma: np.ndarray, beta: np.ndarray):
    model = single_op_model("LayerNormalization", {"x": SHAPE}, {"y": None},
                            {"g": gamma.astype(np.float32), "b": beta.astype(np.float32)}, axis=-1, epsilon=1e-5)
    return quantize_model(model, calib("x", SHAPE, low=-2, high=2))


@pytest.mark.parametrize("kind", ["near ones", "per channel"])
def test_same_integers_as_the_depthwise(kind):
    qdq = layer_norm_qdq(GAMMAS[kind], np.zeros(64))
    depthwise = lower_model(qdq, "int", options=PORTABLE)
    rescale = lower_model(qdq, "int", options=replace(PORTABLE, norm_affine_rescale=True))
    assert "DEPTHWISE_CONV2D" in ops(depthwise) and "DEPTHWISE_CONV2D" not in ops(rescale)
    assert_same_reference(depthwise, rescale)


def test_one_gamma_takes_neither():
    """One positive gamma and no beta: the normalised value rounds straight to the output, whatever this option."""
    qdq = layer_norm_qdq(GAMMAS["ones"], np.zeros(64))
    on = lower_model(qdq, "int", options=replace(PORTABLE, norm_affine_rescale=True))
    assert on.tosa == lower_model(qdq, "int", options=PORTABLE).tosa and "DEPTHWISE_CONV2D" not in ops(on)


def test_a_beta_keeps_the_depthwise():
    qdq = layer_norm_qdq(GAMMAS["ones"], np.full(64, 0.1))
    on = lower_model(qdq, "int", options=replace(PORTABLE, norm_affine_rescale=True))
    assert on.tosa == lower_model(qdq, "int", options=PORTABLE).tosa


@pytest.mark.parametrize("kind,accelerator", [("near ones", "ethos-u55-128"), ("per channel", "ethos-u55-128"),
                                              ("per channel", "ethos-u85-256")])
def test_bitexact_on_npusim(kind, accelerator):
    """Vela's RESCALE of int16 by a 22-bit multiplier rounds as TOSA's does."""
    qdq = layer_norm_qdq(GAMMAS[kind], np.zeros(64))
    fam = "u55" if "u55" in accelerator else "u85"
    lowered = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS[fam], norm_affine_rescale=True))
    assert "DEPTHWISE_CONV2D" not in ops(lowered)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), accelerator))
