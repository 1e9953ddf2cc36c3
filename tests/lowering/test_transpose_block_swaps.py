"""Data movement of a MobileViT-style unfold / fold around row-major readers: the unfold's move lands in the
layout its linear layer reads (no TRANSPOSE back and forth around it), and a TRANSPOSE that is no single swap
of two axis blocks runs as a chain of [A, X, Y, C] block swaps (LoweringOptions.transpose_block_swaps): the
same integers on the TOSA reference model and npu-sim, fewer Vela cycles on U55 and U85."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from npbtest.lowering import assert_same_reference, model_of, npu_bitexact, ops
from npbtest.ops import calib, quantize_model, vela_run
from onnx import helper

from npubuild.ethosu.measured import BLOCK_SWAPS, CHOICES
from npubuild.lowering.driver import lower_model
from npubuild.lowering.emit import block_swaps, reduced_transpose
from npubuild.lowering.options import FAMILY_OPTIONS, PORTABLE
from npubuild.tosa.graph import read_tosa


def _moved(shape: tuple[int, ...], perm: tuple[int, ...]) -> np.ndarray | None:
    """The elements of arange(shape) in the order the block swaps of (shape, perm) leave them (None: no chain)."""
    rshape, rperm = reduced_transpose(shape, perm)
    steps = block_swaps(rshape, rperm)
    if steps is None:
        return None
    dims, cur = list(rshape), np.arange(int(np.prod(shape)))
    for i, j, k in steps:
        view = [int(np.prod(dims[a:b])) for a, b in ((0, i), (i, j), (j, k), (k, len(dims)))]
        cur = cur.reshape(view).transpose(0, 2, 1, 3).reshape(-1)
        dims = dims[:i] + dims[j:k] + dims[i:j] + dims[k:]
    return cur


@pytest.mark.parametrize("shape", [(1, 8, 2, 8, 2, 32), (2, 3, 1, 4, 5), (3, 1, 2, 4), (4, 2, 3)])
def test_block_swaps_move_every_element_as_the_transpose(shape):
    for perm in itertools.permutations(range(len(shape))):
        rshape, rperm = reduced_transpose(shape, perm)
        want = np.transpose(np.arange(int(np.prod(shape))).reshape(shape), perm).reshape(-1)
        assert np.array_equal(np.transpose(np.arange(want.size).reshape(rshape), rperm).reshape(-1), want)
        got = _moved(shape, perm)
        assert got is None or np.array_equal(got, want), perm
        assert (got is None) == (rperm[-1:] != (len(rshape) - 1,))  # only a moving innermost axis has no chain


def test_unfold_chain_is_two_swaps_without_outer_axes():
    rshape, rperm = reduced_transpose((1, 8, 2, 8, 2, 32), (0, 2, 4, 1, 3, 5))
    assert rshape == (8, 2, 8, 2, 32)
    steps = block_swaps(rshape, rperm)
    assert steps is not None and len(steps) == 2 and all(i == 0 for i, _, _ in steps)


def unfold_linear_fold(d: int = 32, size: int = 16):
    """A MobileViT block's data movement: unfold [N, d, H, W] into 2x2 patches [N, 4, P, d], a linear layer
    (MatMul, a row-major reader), fold back to [N, d, H, W]."""
    p = size // 2
    w = np.random.default_rng(0).normal(0, np.sqrt(1.0 / d), (d, d)).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["a"]),
             helper.make_node("Transpose", ["a"], ["b"], perm=[0, 3, 5, 2, 4, 1]),
             helper.make_node("Reshape", ["b", "s2"], ["seq"]),
             helper.make_node("MatMul", ["seq", "w"], ["lin"]),
             helper.make_node("Reshape", ["lin", "s3"], ["c"]),
             helper.make_node("Transpose", ["c"], ["e"], perm=[0, 5, 3, 1, 4, 2]),
             helper.make_node("Reshape", ["e", "s4"], ["y"])]
    inits = {"w": w, "s1": np.array([1, d, p, 2, p, 2], np.int64), "s2": np.array([1, 4, p * p, d], np.int64),
             "s3": np.array([1, 2, 2, p, p, d], np.int64), "s4": np.array([1, d, size, size], np.int64)}
    shape = [1, d, size, size]
    return quantize_model(model_of(nodes, {"x": shape}, {"y": shape}, inits), calib("x", shape))


def _transposes(tosa: bytes) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    g = read_tosa(tosa)
    return [(g.tensors[o.inputs[0]].shape, g.tensors[o.outputs[0]].shape) for o in g.ops if o.op == "TRANSPOSE"]


def test_the_linear_reads_the_unfold_with_no_transpose_back():
    lowered = lower_model(unfold_linear_fold(), "int", options=PORTABLE)
    moves = _transposes(lowered.tosa)
    # the unfold straight into row-major [N, 4, P, d] and the fold back to NHWC: nothing around the linear layer
    assert moves == [((1, 8, 2, 8, 2, 32), (1, 2, 2, 8, 8, 32)), ((1, 2, 2, 8, 8, 32), (1, 8, 2, 8, 2, 32))]


def test_block_swaps_same_integers_fewer_cycles():
    qdq = unfold_linear_fold()
    whole = lower_model(qdq, "int", options=PORTABLE)
    swaps = lower_model(qdq, "int", options=replace(PORTABLE, transpose_block_swaps=True))
    assert ops(swaps).count("TRANSPOSE") == 4 and ops(whole).count("TRANSPOSE") == 2
    assert all(len(a) == 4 and a[0] == 1 for a, _ in _transposes(swaps.tosa))  # each an H/W swap of one image
    assert_same_reference(whole, swaps)
    for accelerator in ("ethos-u55-128", "ethos-u85-256"):
        assert vela_run(swaps.tosa, accelerator).cycles < vela_run(whole.tosa, accelerator).cycles, accelerator
    npu_bitexact(lower_model(qdq, "int", options=FAMILY_OPTIONS["u55"]))


def test_u55_and_u85_take_block_swaps_u65_measures_them():
    assert all(FAMILY_OPTIONS[f].transpose_block_swaps for f in ("u55", "u85", "u85wide"))
    assert not FAMILY_OPTIONS["u65"].transpose_block_swaps and not PORTABLE.transpose_block_swaps
    assert BLOCK_SWAPS in CHOICES["u65"]
    with_transpose = unfold_linear_fold()
    assert BLOCK_SWAPS.applies(with_transpose, FAMILY_OPTIONS["u65"])
    assert not BLOCK_SWAPS.applies(with_transpose, FAMILY_OPTIONS["u55"])
