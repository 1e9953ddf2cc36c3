"""Output rounding: TOSA's DOUBLE_ROUND (hardware TFL rounding) and SINGLE_ROUND (NATURAL), large shifts, zero points."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tosa_serializer as ts
from npbtest.npusim import assert_bitexact, vela_raw

from npubuild.npusim.cmdstream import decode
from npubuild.npusim.npz import load_raw

D = ts.DType


def _attr(kind: str, *args) -> ts.TosaSerializerAttribute:
    a = ts.TosaSerializerAttribute()
    getattr(a, f"{kind}Attribute")(*args)
    return a


def conv8(rounding, shift: int) -> bytes:
    """int8 CONV2D (IFM zero point 3) -> int32 -> RESCALE (32-bit multipliers near 2^31, `shift`) -> int8 (zp -5)."""
    s = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
    rng = np.random.default_rng(shift)
    x = s.addPlaceholder([1, 8, 8, 8], D.INT8)
    s.addConst([16, 3, 3, 8], D.INT8, rng.integers(-127, 128, (16, 3, 3, 8)).astype(np.int8), name="w")
    s.addConst([16], D.INT32, rng.integers(-5000, 5000, 16).astype(np.int32), name="b")
    s.addConst([1], D.INT8, np.array([3], np.int8), name="zi")
    s.addConst([1], D.INT8, np.zeros(1, np.int8), name="zw")
    acc = s.addIntermediate([1, 8, 8, 16], D.INT32)
    s.addOperator(ts.Op.CONV2D, [x.name, "w", "b", "zi", "zw"], [acc.name],
                  _attr("Conv2d", [1, 1, 1, 1], [1, 1], [1, 1], False, D.INT32))
    s.addConst([16], D.INT32, rng.integers(1 << 30, (1 << 31) - 1, 16).astype(np.int32), name="m")
    s.addConst([16], D.INT8, np.full(16, shift, np.int8), name="sh")
    s.addConst([1], D.INT32, np.zeros(1, np.int32), name="rzi")
    s.addConst([1], D.INT8, np.array([-5], np.int8), name="rzo")
    o = s.addOutput([1, 8, 8, 16], D.INT8)
    s.addOperator(ts.Op.RESCALE, [acc.name, "m", "sh", "rzi", "rzo"], [o.name],
                  _attr("Rescale", True, rounding, True, False, False))
    return s.serialize()


@pytest.mark.parametrize("rounding,hw_mode", [(ts.RoundingMode.DOUBLE_ROUND, 0), (ts.RoundingMode.SINGLE_ROUND, 2)],
                         ids=["double", "single"])
@pytest.mark.parametrize("shift", [33, 45])
def test_rounding_modes_bitexact(rounding, hw_mode, shift):
    tosa = conv8(rounding, shift)
    with tempfile.TemporaryDirectory() as tmp:
        npz = vela_raw(tosa, Path(tmp))
        assert_bitexact(tosa, {"inputs": [{"shape": [1, 8, 8, 8], "dtype": "int8"}]}, npz, seeds=(0, 1, 2, 3))
        conv = [c for c in decode(load_raw(npz).commands) if c.kind == "CONV"][0]
        assert conv.regs["OFM_PRECISION"] >> 14 & 3 == hw_mode  # TFL / NATURAL rounding in the command stream
