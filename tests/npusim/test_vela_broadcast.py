"""Vela 5.2 (regor) miscompiles a rank-5 binary op whose FIRST operand is a [1,1,1,1,1] constant for U55/U65.

It keeps the constant as a 1x1x1 IFM and sets IFM2_BROADCAST to 7 (the full IFM2 broadcast, no operand
reversal); the U55 broadcasts IFM2 only, so the NPU reads past the constant. In mobilevit_block (the
softmax's Newton-Raphson reciprocal over [1, 4, 2, 64, 1] rows) this gave 29/30 wrong logits. npu-sim now
names it (VelaMiscompile), and the int32 helpers in lowering/intmath.py run that case on 4-D views.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tosa_serializer as ts
from npbtest.npusim import assert_bitexact, compile_and_check, reference, tosa_inputs, vela_raw
from npbtest.ops import single_op_model
from npbtest.tosa_graphs import Graph, attr

from npubuild.npusim import VelaMiscompile
from npubuild.npusim.cmdstream import decode
from npubuild.npusim.npz import load_raw
from npubuild.npusim.sim import run

ROWS = [1, 4, 2, 64, 1]  # the mobilevit softmax's row shape


def _sub(const_first: bool, shape=ROWS) -> Graph:
    g = Graph()
    x = g.input(shape, np.int32)
    c = g.const(np.full([1] * len(shape), 1000, np.int32))
    g.op(ts.Op.SUB, [c, x] if const_first else [x, c], shape, np.int32, attr("Sub"), output=True)
    return g


def test_vela_miscompiles_a_rank5_scalar_first_sub_and_npusim_says_so():
    g = _sub(const_first=True)
    tosa = g.serialize()
    xs = tosa_inputs(g.io, 0)
    want = reference(tosa, xs)[0]
    assert np.array_equal(want, 1000 - xs[0].astype(np.int64))  # the graph is fine: 1000 - x
    with tempfile.TemporaryDirectory() as tmp:
        model = load_raw(vela_raw(tosa, Path(tmp)))
    (sub,) = [c for c in decode(model.commands, "x") if c.kind == "ELEMENTWISE"]
    assert sub.regs["IFM2_BROADCAST"] == 7  # IFM2 (the full tensor) "broadcast", operands not reversed
    assert sub.regs.get("IFM_DEPTH_M1", 0) == 0 and sub.regs["OFM_DEPTH_M1"] > 0
    with pytest.raises(VelaMiscompile, match=r"Vela miscompiled ELEMENTWISE SUB: its IFM is 1x1x1 for an OFM"):
        run(model, xs)


@pytest.mark.parametrize("const_first, shape", [(False, ROWS), (True, [4, 2, 64, 1]), (True, [2, 3, 4, 5])])
def test_the_same_sub_otherwise_is_bit_exact(const_first, shape):
    """The constant second, or a rank-4 graph: Vela reverses the operands itself and npu-sim agrees."""
    g = _sub(const_first, shape)
    tosa = g.serialize()
    with tempfile.TemporaryDirectory() as tmp:
        npz = vela_raw(tosa, Path(tmp))
        assert_bitexact(tosa, g.io, npz)


def test_rank5_softmax_reciprocal_is_bit_exact_on_u55():
    """Softmax over a 5-D tensor: its reciprocal subtracts rows from [1,1,1,1,1] constants (intmath)."""
    model = single_op_model("Softmax", {"x": [1, 4, 2, 8, 16]}, {"y": None}, axis=-1)
    artifact = compile_and_check(model, [1, 4, 2, 8, 16])
    subs = [c for c in decode(artifact.commands, "x") if c.kind == "ELEMENTWISE" and c.param == 2]
    assert any(c.regs.get("IFM2_BROADCAST", 0) & 64 for c in subs)  # constant - rows, operands reversed by Vela
