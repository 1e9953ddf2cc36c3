"""U85 ELEMENTWISE: per-operand scaling and broadcast, then arithmetic, shifts, comparisons and logic.

Each operand is its IFM/IFM2 (or the 32-bit OP_SCALAR when its broadcast mode is SCALAR) minus its zero
point, broadcast over H, W and/or C (IFM/IFM2_BROADCAST bits 0-2), then scaled by IFM/IFM2_SCALE
(multiplier, shift, rounding; a unit scale is the identity). LRELU scales its one input twice: by
IFM_SCALE where it is non-negative, by IFM2_SCALE (alpha folded in) where it is negative. SHR is the
arithmetic shift, rounding as the OFM round mode says; LSR the logical one on the IFM's width; comparisons give 0 or -1
(all ones, as TOSA's bool); DIV truncates towards zero.
"""

from __future__ import annotations

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim import NotModelled
from npubuild.npusim.npu_op import clz, ofm_shape
from npubuild.npusim.u85.activation import global_scale, ofm_rounding
from npubuild.npusim.u85.machine_state import Machine, OpResult
from npubuild.npusim.u85.operands import Operand, operand, read
from npubuild.npusim.u85.scaling import scale

MODES = {0: "MUL", 1: "ADD", 2: "SUB", 3: "MIN", 4: "MAX", 5: "LRELU", 6: "ABS", 7: "CLZ", 8: "SHR", 9: "SHL",
         10: "LSR", 11: "DIV", 16: "CMP_EQ", 17: "CMP_NE", 18: "CMP_GE", 19: "CMP_GT", 33: "AND", 34: "OR",
         35: "XOR", 36: "NOT", 42: "AND_NOT"}
UNARY = ("LRELU", "ABS", "CLZ", "NOT")
SCALAR = 8


def _wrap32(v: np.ndarray) -> np.ndarray:
    v = v & 0xFFFFFFFF
    return np.where(v >= 1 << 31, v - (1 << 32), v)


def _input(m: Machine, cmd, prefix: str, oh: int, ow: int, oc: int) -> tuple[np.ndarray, Operand, str]:
    """An operand minus its zero point, broadcast to the OFM shape; and how it was broadcast."""
    b = cmd.regs.get(f"{prefix}_BROADCAST", 0) & 0xF
    op = operand(cmd, prefix)
    if b == SCALAR:
        scalar = cmd.regs.get("OP_SCALAR", 0)
        value = scalar - (1 << 32) if scalar >> 31 and op.fm.signed else scalar
        return np.full((*m.lead, oh, ow, oc), value - op.fm.zero_point, np.int64), op, "scalar"
    h, w, c = (1 if b & 1 else oh), (1 if b & 2 else ow), (1 if b & 4 else oc)
    x = read(m.mem, m.chains, op, h, w, c) - op.fm.zero_point
    how = "".join(a for a, bit in zip("HWC", (1, 2, 4), strict=True) if b & bit)
    return np.broadcast_to(x, (*x.shape[:-3], oh, ow, oc)), op, f"broadcast {how}" if how else ""


def _scaled(cmd, reg: str, v: np.ndarray) -> np.ndarray:
    mult, shift = global_scale(cmd, reg)
    if (mult, shift) == (1, 0):
        return v
    rnd = (cmd.hi.get(reg, 0) >> 13) & 1  # IFM round modes: 0 double symmetric, 1 natural (the OFM numbering)
    return scale(v, mult, shift, rnd, (cmd.hi.get(reg, 0) >> 6) & 0x1F)


def _compute(mode: str, a: np.ndarray, b: np.ndarray, cmd, bits: int) -> np.ndarray:
    if mode == "ADD":
        return a + b
    if mode == "SUB":
        return a - b
    if mode == "MUL":
        return a * b
    if mode == "MIN":
        return np.minimum(a, b)
    if mode == "MAX":
        return np.maximum(a, b)
    if mode == "ABS":
        return np.abs(a)
    if mode == "CLZ":
        return clz(a)
    if mode == "SHL":
        return _wrap32(a << np.clip(b, 0, 31))
    if mode == "SHR":
        rounding, _ = ofm_rounding(cmd)
        return scale(a, 1, np.clip(b, 0, 31), rounding)
    if mode == "LSR":  # on the IFM's width
        return (a & ((1 << bits) - 1)) >> np.clip(b, 0, bits - 1)
    if mode == "DIV":
        if np.any(b == 0):
            raise StageError("ELEMENTWISE DIV by zero")
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -q, q)
    if mode.startswith("CMP_"):
        test = {"CMP_EQ": a == b, "CMP_NE": a != b, "CMP_GE": a >= b, "CMP_GT": a > b}[mode]
        return np.where(test, -1, 0).astype(np.int64)
    if mode == "AND":
        return a & b
    if mode == "OR":
        return a | b
    if mode == "XOR":
        return a ^ b
    if mode == "NOT":
        return ~a
    if mode == "AND_NOT":
        return a & ~b
    raise NotModelled(f"ELEMENTWISE {mode} is not modelled")


def run_elementwise(m: Machine, cmd) -> OpResult:
    mode = MODES.get(cmd.param & 0x3F)
    if mode is None:
        raise StageError(f"unknown elementwise mode {cmd.param}")
    oh, ow, oc = ofm_shape(cmd)
    a, ifm, how = _input(m, cmd, "IFM", oh, ow, oc)
    details = [f"ifm {how}"] if how else []
    if mode == "LRELU":
        acc = np.where(a >= 0, _scaled(cmd, "IFM_SCALE", a), _scaled(cmd, "IFM2_SCALE", a))
        ifm2_shape = None
    elif mode in UNARY:
        acc = _compute(mode, _scaled(cmd, "IFM_SCALE", a), a, cmd, ifm.fm.bits)
        ifm2_shape = None
    else:
        b, _, how2 = _input(m, cmd, "IFM2", oh, ow, oc)
        if how2:
            details.append(f"ifm2 {how2}")
        ifm2_shape = b.shape[-3:]
        acc = _compute(mode, _scaled(cmd, "IFM_SCALE", a), _scaled(cmd, "IFM2_SCALE", b), cmd, ifm.fm.bits)
    return m.output(cmd, f"ELEMENTWISE {mode}", np.asarray(acc, np.int64), (oh, ow, oc), ifm,
                    ", ".join(details), ifm2_shape)
