"""A layer norm's affine step as an int16 MUL by a gamma vector and an int16 ADD of a beta vector (LoweringOptions.
norm_affine_vectors, size mode's memory choice): within 1 LSB of onnxruntime's QDQ layer norm as the depthwise form
is, run by Vela's command stream as the TOSA reference model runs it, and fewer off-chip bytes in Vela's figures."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from npbtest.lowering import ops
from npbtest.npusim import assert_bitexact, reference, tosa_inputs, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, rand, single_op_model

from npubuild.ethosu.measured import vela_figures
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PORTABLE

SHAPE = [24, 64]
_rng = np.random.default_rng(3)
AFFINES = {  # (gamma, beta)
    "transformer-like": (_rng.uniform(0.8, 1.2, 64), _rng.uniform(-0.15, 0.15, 64)),
    "signs, a dead channel, a wide beta": (np.r_[0.0, _rng.uniform(-3.0, 3.0, 63)], _rng.uniform(-2.0, 2.0, 64)),
    "no beta, negative gammas": (_rng.uniform(-2.0, 2.0, 64), np.zeros(64)),  # the RESCALE form cannot take these
}
VECTORS = replace(PORTABLE, norm_affine_vectors=True)
# the int16 MUL's product plus beta as an int32 vector, on the one node (norm_affine_wide_beta_nodes)
WIDE_BETA = replace(PORTABLE, norm_affine_wide_beta_nodes=frozenset({"the_layernormalization"}))


def layer_norm(gamma: np.ndarray, beta: np.ndarray):
    return single_op_model("LayerNormalization", {"x": SHAPE}, {"y": None},
                           {"g": gamma.astype(np.float32), "b": beta.astype(np.float32)}, axis=-1, epsilon=1e-5)


CALIB = calib("x", SHAPE, low=-2, high=2)
FEEDS = {"x": rand([8, *SHAPE][1:], 7, -2, 2)}


@pytest.mark.parametrize("form", ["vectors", "wide beta"])
@pytest.mark.parametrize("kind", sorted(AFFINES))
def test_within_one_lsb_as_the_depthwise(kind, form):
    model = layer_norm(*AFFINES[kind])
    vectors, _ = check_int(model, CALIB, FEEDS, max_lsb=1.0, options=VECTORS if form == "vectors" else WIDE_BETA)
    depthwise, _ = check_int(model, CALIB, FEEDS, max_lsb=1.0, options=PORTABLE)
    assert "DEPTHWISE_CONV2D" in ops(depthwise) and "DEPTHWISE_CONV2D" not in ops(vectors) and "MUL" in ops(vectors)
    # the one rounding lands where the depthwise's does but within ~1/256 of a boundary: rare 1-LSB flips
    io = io_dict(vectors)
    for seed in range(3):
        xs = tosa_inputs(io, seed)
        (a,), (b,) = reference(depthwise.tosa, xs), reference(vectors.tosa, xs)
        diff = np.abs(a.astype(np.int32) - b.astype(np.int32))
        assert diff.max() <= 1 and np.count_nonzero(diff) <= 0.01 * diff.size, (int(diff.max()), np.count_nonzero(diff))


def test_not_an_exact_form():
    """The family's own graph with this form is checked against the QDQ model, not bit for bit (families.py)."""
    assert PORTABLE.same_integers and not VECTORS.same_integers and not WIDE_BETA.same_integers
    assert not replace(PORTABLE, norm_affine_vectors_nodes=frozenset({"the_layernormalization"})).same_integers


@pytest.mark.parametrize("kind,accelerator", [("transformer-like", "ethos-u55-128"),
                                              ("signs, a dead channel, a wide beta", "ethos-u65-256"),
                                              ("no beta, negative gammas", "ethos-u85-256"),
                                              ("signs, a dead channel, a wide beta", "ethos-u85-256")])
def test_bitexact_on_npusim(kind, accelerator):
    """Vela fuses the MUL's RESCALE and the ADD's three into two elementwise ops that round as TOSA does; the
    wide-beta form's int32 ADD and its RESCALE too."""
    qdq = quantize_model(layer_norm(*AFFINES[kind]), CALIB)
    fam = accelerator.split("-")[1]
    for form in ({"norm_affine_vectors": True}, {"norm_affine_wide_beta_nodes": frozenset({"the_layernormalization"})}):
        lowered = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS[fam], **form))
        assert "DEPTHWISE_CONV2D" not in ops(lowered)
        with tempfile.TemporaryDirectory() as tmp:
            assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), accelerator))


@pytest.mark.parametrize("accelerator", ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"])
def test_vela_stores_fewer_bytes(accelerator):
    """4 bytes a channel of gamma and beta where the depthwise has 10 of scale and bias (and its weights); 6 with
    the int32 beta."""
    qdq = quantize_model(layer_norm(*AFFINES["transformer-like"]), CALIB)
    fam = accelerator.split("-")[1]
    own = FAMILY_OPTIONS[fam]
    figures = [vela_figures(lower_model(qdq, "int", options=o).tosa, accelerator, "size")
               for o in (own, replace(own, norm_affine_vectors=True),
                         replace(own, norm_affine_wide_beta_nodes=frozenset({"the_layernormalization"})))]
    assert figures[1]["offchip_kib"] < figures[0]["offchip_kib"], figures
    assert figures[2]["offchip_kib"] < figures[0]["offchip_kib"], figures
