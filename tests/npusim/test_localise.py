"""The npu-sim localiser blames the first NPU op that writes a wrong value, not a correct piece of a split op.

Vela runs a 6-D TRANSPOSE as thousands of strided 1x1 copies whose OFMs are pieces of no TOSA tensor: the
mobilevit_block failure was reported at "NPU op #5 POOL AVERAGE", one such correct piece, while the wrong op
was #4023 (an ELEMENTWISE SUB thousands of ops later). The trace below has that structure, on real arrays.
"""

from __future__ import annotations

import numpy as np

from npubuild.npusim.npu_op import OpResult
from npubuild.npusim.tosa_probe import GraphOp
from npubuild.npusim.verify import localise

RNG = np.random.default_rng(3)


def _op(n: int, kind: str, ofm: np.ndarray) -> OpResult:
    return OpResult(n, kind, ofm.shape, "NHWC", ofm.shape, "NHWC", "", ofm.astype(np.int64), ofm_bits=ofm.dtype.itemsize * 8)


def _case():
    a = RNG.integers(-128, 128, (1, 4, 2, 4)).astype(np.int8)  # graph input
    b = a.transpose(0, 1, 3, 2).copy()  # TRANSPOSE: [1, 4, 4, 2]
    c = (b // 2).astype(np.int8)  # RESCALE
    d = (100 - c.astype(np.int32)).astype(np.int32)  # SUB(const, c)
    e = np.clip(d, -128, 127).astype(np.int8)  # RESCALE: the output
    inter = {"b": b, "c": c, "d": d, "e": e}
    graph = [GraphOp("TRANSPOSE", ("a",), ("b",)), GraphOp("RESCALE", ("b", "m", "s"), ("c",)),
             GraphOp("SUB", ("k", "c"), ("d",)), GraphOp("RESCALE", ("d", "m2", "s2"), ("e",))]
    pieces = [_op(w, "POOL AVERAGE", a[0, :, w, :].T.reshape(4, 4, 1).copy()) for w in range(2)]  # strided copies
    wrong_d = d.copy().reshape(4, 4, 2)
    wrong_d[1:] = -100  # what the miscompiled SUB wrote
    trace = [*pieces, _op(2, "POOL AVERAGE", c.reshape(4, 4, 2)), _op(3, "ELEMENTWISE SUB", wrong_d),
             _op(4, "ELEMENTWISE ADD", np.clip(wrong_d, -128, 127).astype(np.int8))]
    return trace, inter, graph


def test_the_graph_blames_the_first_wrong_op_after_a_correct_checkpoint():
    trace, inter, graph = _case()
    found = localise(trace, inter, graph)
    assert found is not None and found.op == 3 and found.kind == "ELEMENTWISE SUB"
    assert found.describe() == ("NPU op #3 ELEMENTWISE SUB (ofm [4, 4, 2] NHWC) differs from TOSA SUB -> d "
                                "[1, 4, 4, 2] (the first TOSA result npu-sim does not reproduce)")


def test_without_the_graph_a_transpose_piece_is_blamed():
    """The OFM-only search (kept as the fallback) stops at the first piece: why the graph is used first."""
    trace, inter, _ = _case()
    found = localise(trace, inter)
    assert found is not None and found.op == 0 and found.kind == "POOL AVERAGE" and "b" in found.candidates


def test_a_right_clz_of_a_wrong_sum_does_not_vouch_for_the_sum():
    """A softmax's reciprocal: n = CLZ(s), m = s << (n - 1). A slightly wrong s (made by the REDUCE_SUM) has the
    right CLZ; the sum is to blame, not the shift that is its first other reader."""
    x = RNG.integers(0, 1000, (1, 1, 1, 20)).astype(np.int32)
    s = (x * 1000 + 123).astype(np.int32)  # REDUCE_SUM
    n = np.full_like(s, 32) - np.ceil(np.log2(s + 1)).astype(np.int32)  # CLZ
    m = (s << (n - 1)).astype(np.int32)  # LOGICAL_LEFT_SHIFT
    inter = {"s": s, "n": n, "m": m}
    graph = [GraphOp("REDUCE_SUM", ("x",), ("s",)), GraphOp("CLZ", ("s",), ("n",)),
             GraphOp("LOGICAL_LEFT_SHIFT", ("s", "n"), ("m",))]
    wrong_s = s.copy()
    wrong_s[..., 3] += 1  # one row's sum one off: same bit length
    trace = [_op(0, "POOL REDUCE_SUM", wrong_s.reshape(1, 1, 20)), _op(1, "ELEMENTWISE CLZ", n.reshape(1, 1, 20)),
             _op(2, "ELEMENTWISE SHL", (wrong_s << (n - 1)).astype(np.int32).reshape(1, 1, 20))]
    found = localise(trace, inter, graph)
    assert found is not None and found.op == 0 and found.tosa_op.startswith("REDUCE_SUM")
