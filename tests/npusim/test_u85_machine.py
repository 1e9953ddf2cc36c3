"""The U85 machine on hand-made command streams: chaining buffers, the kept accumulator, and what is not modelled
(control flow, the TANH/SIGMOID LUT functions, TILE3X1 storage) failing as NotModelled with the op named."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.errors import StageError
from npubuild.npusim import NotModelled
from npubuild.npusim.npz import RawModel, TensorPlace
from npubuild.npusim.sim import run
from npubuild.npusim.u85.registers import BY_NAME


def w(name: str, param: int = 0, data: int | None = None) -> list[int]:
    """One command by register name: cmd0 (16-bit parameter) or cmd1 (parameter and 32-bit payload)."""
    reg = BY_NAME[name]
    if reg.long:
        return [reg.code | 0x4000 | (param & 0xFFFF) << 16, (data or 0) & 0xFFFFFFFF]
    return [reg.code | (param & 0xFFFF) << 16]


SIGNED8 = 1  # PRECISION: signed, 8 bits, NHWC, TILE2X2
CHAINED = 2 << 14
GLOBAL = 1 << 8  # OFM_PRECISION: OFM_SCALE for every channel (else the scale stream's)
UNIT = w("IFM_SCALE", 0, 1) + w("IFM2_SCALE", 0, 1) + w("OFM_SCALE", 1 << 13, 1)  # scale 1, shift 0, natural


def _fm(prefix: str, base: int, region: int = 1, precision: int = SIGNED8) -> list[int]:
    """A 1x2x4 int8 NHWC feature map at `base`."""
    words = w(f"{prefix}_PRECISION", precision) + w(f"{prefix}_REGION", region) + w(f"{prefix}_BASE0", 0, base)
    for i in (1, 2, 3):
        words += w(f"{prefix}_BASE{i}", 0, 0)
    words += (w(f"{prefix}_HEIGHT0_M1", 0) + w(f"{prefix}_HEIGHT1_M1", 0) + w(f"{prefix}_WIDTH0_M1", 1)
              + w(f"{prefix}_STRIDE_X", 0, 4) + w(f"{prefix}_STRIDE_Y", 0, 8) + w(f"{prefix}_STRIDE_C", 0, 1))
    return words


SHAPE = w("OFM_HEIGHT_M1", 0) + w("OFM_WIDTH_M1", 1) + w("OFM_DEPTH_M1", 3) + w("IFM_DEPTH_M1", 3)
CLIP = w("ACTIVATION", 0) + w("ACTIVATION_MIN", -128) + w("ACTIVATION_MAX", 127)


def _model(words: list[int]) -> RawModel:
    """Inputs a (offset 0) and b (8) and output (16) in region 1, each 1x2x4 int8."""
    stream = np.array([*words, *w("STOP", 0xFFFF)], np.uint32)
    places = [TensorPlace((1, 1, 2, 4), 1, 1, off) for off in (0, 8, 16)]
    return RawModel("hand-made", "ethos-u85-256", 1, stream, b"\0" * 64, 0, 1, 64, 2, 0, 16, places[:2], places[2:])


def _inputs() -> list[np.ndarray]:
    a = np.arange(8, dtype=np.int8).reshape(1, 1, 2, 4) - 3
    return [a, (a * 5).astype(np.int8)]


ADD, MUL = w("ELEMENTWISE", 1), w("ELEMENTWISE", 0)
BROADCAST_NONE = w("IFM_BROADCAST", 0) + w("IFM2_BROADCAST", 0)


def test_chained_operand_goes_through_a_chaining_buffer():
    """(a + b) chained to buffer 3, then (chained * a) to memory: a*(a + b), without the sum touching memory."""
    first = UNIT + _fm("IFM", 0) + _fm("IFM2", 8) + _fm("OFM", 0, region=3, precision=SIGNED8 | CHAINED | GLOBAL)
    second = _fm("IFM", 0, region=3, precision=SIGNED8 | CHAINED) + _fm("IFM2", 0) + _fm("OFM", 16, precision=SIGNED8 | GLOBAL)
    words = SHAPE + CLIP + BROADCAST_NONE + first + ADD + second + MUL
    a, b = _inputs()
    res = run(_model(words), [a, b])
    want = np.clip(a.astype(np.int64) * (a.astype(np.int64) + b), -128, 127)
    np.testing.assert_array_equal(res.outputs[0], want)
    assert [op.ofm_format for op in res.ops] == ["CHAINED", "NHWC"]
    # an op that reads a chaining buffer nothing wrote names itself
    with pytest.raises(StageError, match=r"NPU op #0 ELEMENTWISE: .*chaining buffer 3"):
        run(_model(SHAPE + CLIP + BROADCAST_NONE + UNIT + second + MUL), [a, b])


def test_kept_accumulator_sums_across_ops():
    """SUM pool of a with the output disabled, then SUM pool of b keeping it: a + b written once."""
    pool = w("KERNEL_WIDTH_M1", 0) + w("KERNEL_HEIGHT_M1", 0) + w("KERNEL_STRIDE", 0) + w("POOL", 3)
    keep_off = w("ACC_FORMAT", 1 << 6)  # reset, output disabled
    keep_on = w("ACC_FORMAT", 1 << 4)  # keep, output enabled
    words = (SHAPE + CLIP + UNIT + _fm("IFM", 0) + _fm("OFM", 16, precision=SIGNED8 | GLOBAL) + keep_off + pool
             + _fm("IFM", 8) + keep_on + pool)
    a, b = _inputs()
    res = run(_model(words), [a, b])
    np.testing.assert_array_equal(res.outputs[0], np.clip(a.astype(np.int64) + b, -128, 127))
    assert [op.ofm_format for op in res.ops] == ["ACC", "NHWC"]


@pytest.mark.parametrize("case,match", [
    ("branch", r"NPU op #0 BRANCH: control flow"),
    ("sigmoid", r"NPU op #0 ELEMENTWISE: activation LUT_SIGMOID is not modelled"),
    ("tile3x1", r"NPU op #0 ELEMENTWISE: IFM storage TILE3X1"),
])
def test_unmodelled_features_name_the_op(case, match):
    words = SHAPE + CLIP + BROADCAST_NONE + UNIT + _fm("IFM", 0) + _fm("IFM2", 8) + _fm("OFM", 16, precision=SIGNED8 | GLOBAL)
    if case == "branch":
        words = w("BRANCH", 0, 0)
    elif case == "sigmoid":
        words += w("ACTIVATION", 11) + ADD
    else:
        words += w("IFM_PRECISION", SIGNED8 | 1 << 14) + ADD
    with pytest.raises(NotModelled, match=match):
        run(_model(words), _inputs())
