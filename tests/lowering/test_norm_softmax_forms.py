"""Two forms that cut a full-size pass from a transformer's layer norm and softmax (issue 33, U55 example ratio).

A layer norm of one positive gamma and no beta (torch's default) rounds its normalised value once, straight to the
output (ops/norm._uniform_scale, every lowering): within 1 LSB of onnxruntime's QDQ layer norm, no depthwise, fewer
Vela cycles on U55, U65 and U85. The softmax's per-row shift moved into its int16 reciprocal
(LoweringOptions.softmax_shift_mul) is not bit for bit the portable form: within 1 LSB of the QDQ node, 1 LSB off the
portable graph on few elements, fewer Vela cycles on every family, but no family takes it (it would make the family's
graph non-exact). Both run on the NPU as the TOSA reference model runs them."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from npbtest.lowering import errors_vs_unfused_qdq, ops
from npbtest.npusim import assert_bitexact, reference, tosa_inputs, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, rand, single_op_model, vela_run

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PORTABLE
from npubuild.tosa.graph import read_tosa

LN_SHAPE = [16, 64]
SOFTMAX_SHAPE = [4, 16, 16]
FAMILIES = {"ethos-u55-128": "u55", "ethos-u65-256": "u65", "ethos-u85-256": "u85"}


def with_forms(family: str):
    """The family's options with the softmax form."""
    return replace(FAMILY_OPTIONS[family], softmax_shift_mul=True)


def layer_norm(gamma: float | np.ndarray, beta: float | np.ndarray):
    g = np.broadcast_to(np.asarray(gamma, np.float32), (LN_SHAPE[-1],)).copy()
    b = np.broadcast_to(np.asarray(beta, np.float32), (LN_SHAPE[-1],)).copy()
    return single_op_model("LayerNormalization", {"x": LN_SHAPE}, {"y": None}, {"g": g, "b": b}, axis=-1,
                           epsilon=1e-5)


def softmax():
    return single_op_model("Softmax", {"x": SOFTMAX_SHAPE}, {"y": None}, axis=-1)


def _apart(a: bytes, b: bytes, io: dict, seeds=range(4)) -> np.ndarray:
    """|a - b| over every output element of the two graphs on the TOSA reference model, random int8 inputs."""
    out = []
    for seed in seeds:
        xs = tosa_inputs(io, seed)
        (ya,), (yb,) = reference(a, xs), reference(b, xs)
        out.append(np.abs(ya.astype(np.int32) - yb.astype(np.int32)).ravel())
    return np.concatenate(out)


def _full_size(tosa: bytes, op: str, size: int) -> int:
    """How many `op`s of the graph write a tensor of `size` elements."""
    g = read_tosa(tosa)
    return sum(o.op == op and int(np.prod(g.tensors[o.outputs[0]].shape)) == size for o in g.ops)


@pytest.mark.parametrize("gamma", [1.0, 0.7, 2.5])
def test_uniform_layer_norm_within_one_lsb_and_no_affine_pass(gamma):
    """One positive gamma, no beta: the normalised value rounds once to the output, no depthwise."""
    feeds = {"x": rand(LN_SHAPE, 7, -2, 2)}
    cal = calib("x", LN_SHAPE, low=-2, high=2)
    uniform, _ = check_int(layer_norm(gamma, 0.0), cal, feeds, max_lsb=1.0, options=PORTABLE)
    assert "DEPTHWISE_CONV2D" not in ops(uniform)
    assert not any(o.op == "RESCALE" and read_tosa(uniform.tosa).tensors[o.outputs[0]].dtype == "INT16"
                   for o in read_tosa(uniform.tosa).ops)
    err = errors_vs_unfused_qdq(layer_norm(gamma, 0.0), "x", LN_SHAPE, 2.0, seeds=range(10, 16))
    assert err.max() <= 1 and (err > 0).mean() <= 0.005, (err.max(), (err > 0).mean())


@pytest.mark.parametrize("gamma,beta", [(np.r_[np.ones(63), 1.1], 0.0), (1.0, 0.1), (-1.0, 0.0)])
def test_other_affines_keep_the_depthwise(gamma, beta):
    qdq = quantize_model(layer_norm(gamma, beta), calib("x", LN_SHAPE, low=-2, high=2))
    assert "DEPTHWISE_CONV2D" in ops(lower_model(qdq, "int"))


@pytest.mark.parametrize("accelerator", sorted(FAMILIES))
def test_uniform_layer_norm_costs_vela_less_than_the_depthwise(accelerator):
    """Against the same layer norm with one channel's gamma 10% off (the depthwise form), on every family."""
    figures = []
    for gamma in (1.0, np.r_[np.ones(63), 1.1]):
        qdq = quantize_model(layer_norm(gamma, 0.0), calib("x", LN_SHAPE, low=-3, high=3))
        figures.append(vela_run(lower_model(qdq, "int", family=FAMILIES[accelerator]).tosa, accelerator).cycles)
    assert figures[0] < figures[1], figures


def test_softmax_within_one_lsb_and_no_full_size_shift():
    model = softmax()
    feeds = {"x": rand(SOFTMAX_SHAPE, 2, -4, 4)}
    cal = calib("x", SOFTMAX_SHAPE, low=-4, high=4)
    shifted, _ = check_int(model, cal, feeds, max_lsb=1.0, options=with_forms("u55"))
    portable, _ = check_int(model, cal, feeds, max_lsb=1.0, options=PORTABLE)
    size = int(np.prod(SOFTMAX_SHAPE))
    assert _full_size(portable.tosa, "ARITHMETIC_RIGHT_SHIFT", size) == 1
    assert _full_size(shifted.tosa, "ARITHMETIC_RIGHT_SHIFT", size) == 0
    diff = _apart(portable.tosa, shifted.tosa, io_dict(shifted), seeds=range(8))
    assert diff.max() <= 1 and np.count_nonzero(diff) <= 0.005 * diff.size, (int(diff.max()), np.count_nonzero(diff))


def test_softmax_form_is_not_exact():
    """The family's graph with it would be held to the QDQ model's error, not checked bit for bit (families.py):
    exact_only drops it, and no family takes it."""
    assert not replace(PORTABLE, softmax_shift_mul=True).same_integers
    assert not with_forms("u55").exact_only().softmax_shift_mul
    assert not any(o.softmax_shift_mul for o in FAMILY_OPTIONS.values())


@pytest.mark.parametrize("accelerator", sorted(FAMILIES))
def test_softmax_form_costs_vela_less_on_every_family(accelerator):
    fam = with_forms(FAMILIES[accelerator])
    qdq = quantize_model(softmax(), calib("x", SOFTMAX_SHAPE, low=-3, high=3))
    on = vela_run(lower_model(qdq, "int", options=fam).tosa, accelerator).cycles
    off = vela_run(lower_model(qdq, "int", options=replace(fam, softmax_shift_mul=False)).tosa, accelerator).cycles
    assert on < off, (on, off)


@pytest.mark.parametrize("kind", ["softmax", "layer norm"])
def test_npu_runs_it_as_the_reference_model(kind):
    """Vela fuses the MUL's and the SUB's output RESCALE (a constant power of two) into them and rounds as TOSA."""
    model, shape = (softmax(), SOFTMAX_SHAPE) if kind == "softmax" else (layer_norm(1.0, 0.0), LN_SHAPE)
    lowered = lower_model(quantize_model(model, calib("x", shape, low=-3, high=3)), "int",
                          options=with_forms("u55") if kind == "softmax" else FAMILY_OPTIONS["u55"])
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp), "ethos-u55-128"))


@pytest.mark.parametrize("kind", ["softmax", "layer norm"])
def test_scalar_first_gives_the_same_integers_and_fewer_u55_cycles(kind):
    """LoweringOptions.scalar_first (u55): the per-row statistics' scalar operands first, a SUB of a constant as an
    ADD, a rounding shift by a constant as a MUL by one: the portable graph's integers for random int8 inputs on
    the TOSA reference model, and fewer U55-128 cycles for a layer norm (Vela runs its [1, 1, 1, 16] ops in 20,
    not 128)."""
    gamma = np.random.default_rng(4).uniform(0.8, 1.2, 64)
    model, shape = (softmax(), SOFTMAX_SHAPE) if kind == "softmax" else (layer_norm(gamma, 0.1), LN_SHAPE)
    qdq = quantize_model(model, calib("x", shape, low=-3, high=3))
    u55 = FAMILY_OPTIONS["u55"]
    first, last = (lower_model(qdq, "int", options=replace(u55, scalar_first=on)) for on in (True, False))
    assert u55.scalar_first and u55.same_integers and first.tosa != last.tosa
    assert not _apart(first.tosa, last.tosa, io_dict(first), seeds=range(6)).any()
    cycles = [vela_run(g.tosa, "ethos-u55-128").cycles for g in (first, last)]
    # a softmax's 64 rows run at Vela's per-element figures either way; a layer norm's 16 pay the scalar's 128
    assert cycles[0] < cycles[1] if kind == "layer norm" else cycles[0] == cycles[1], cycles
