"""The U85 output stage: OFM scale, zero point, clip (ACTIVATION_MIN/MAX), LUT, saturation to the OFM type.

ACTIVATION: bits 0-4 the function, 5-7 the table, 12 the clip range (B16: clip to the 16-bit
ACTIVATION_MIN/MAX, then saturate to the OFM type; NONE: no clip, the value wraps to the OFM's width,
which is how Vela casts int16 to int8 the TOSA way). LUTs live in the 2 KiB LUT RAM, loaded by DMA: 8-bit in, 8/16/32-bit
out (256 entries of 1, 2 or 4 bytes; `table` counts tables of that size), or 16-bit in with 512
interpolated entries (int16 base, int16 slope): base * 128 + slope * (x & 127), for x + 32768 >> 7
the entry; the S16_S16 form rounds that back by 7 bits.
"""

from __future__ import annotations

import numpy as np

from npubuild.npusim import NotModelled
from npubuild.npusim.cmdstream import Command
from npubuild.npusim.memory import constant_bytes
from npubuild.npusim.npu_op import clamp_bounds, clamp_in_place, type_range
from npubuild.npusim.u85.operands import Operand
from npubuild.npusim.u85.scaling import saturate, scale

LUT_RAM_BYTES = 2048
FUNCTIONS = {0: "LUT_NONE", 1: "LUT_U8_U8", 4: "LUT_S8_S8", 5: "LUT_S8_S16", 7: "LUT_S8_S32", 8: "LUT_S16_S16",
             9: "LUT_S16_S32", 10: "LUT_TANH", 11: "LUT_SIGMOID"}
# function -> (input bits, input signed, entry bytes); the 16-bit forms interpolate
_TABLES = {1: (8, False, 1), 4: (8, True, 1), 5: (8, True, 2), 7: (8, True, 4), 8: (16, True, 4), 9: (16, True, 4)}


def ofm_rounding(cmd: Command) -> tuple[int, int]:
    """(round mode, double-round position) from OFM_SCALE."""
    hi = cmd.hi.get("OFM_SCALE", 0)
    return (hi >> 13) & 7, (hi >> 6) & 0x1F


def global_scale(cmd: Command, reg: str = "OFM_SCALE") -> tuple[int, int]:
    """(multiplier, shift) of an OFM/IFM/IFM2_SCALE register (multiplier 31 bits, shift 6)."""
    return cmd.regs.get(reg, 1) & 0x7FFFFFFF, cmd.hi.get(reg, 0) & 0x3F


def _lookup(lut_ram: np.ndarray, fn: int, table: int, v: np.ndarray) -> np.ndarray:
    bits, signed, entry = _TABLES[fn]
    v = saturate(v, bits, signed)
    if bits == 8:
        size = 256 * entry
        raw = lut_ram[table * size:(table + 1) * size]
        dtype = {1: np.int8 if signed else np.uint8, 2: np.dtype("<i2"), 4: np.dtype("<i4")}[entry]
        values = raw.view(dtype).astype(np.int64)
        return values[(v + 128) if signed else v]
    pairs = lut_ram.view("<i2").astype(np.int64).reshape(512, 2)
    u = v + 32768
    base, slope = pairs[u >> 7, 0], pairs[u >> 7, 1]
    out = base * 128 + slope * (u & 0x7F)
    return out if fn == 9 else (out + 64) >> 7


def finish(cmd: Command, acc: np.ndarray, mult, shift, ofm: Operand, lut_ram: np.ndarray) -> np.ndarray:
    """Accumulator -> OFM values (int64, within the OFM type)."""
    mode, dbl = ofm_rounding(cmd)
    v = scale(acc, mult, shift, mode, dbl)  # a new array: the zero point and the clip go into it
    v += ofm.fm.zero_point
    act = cmd.regs.get("ACTIVATION", 0)
    fn, table, no_clip = act & 0x1F, (act >> 5) & 7, (act >> 12) & 1
    if not no_clip:
        lo = cmd.s16("ACTIVATION_MIN")
        hi = cmd.regs.get("ACTIVATION_MAX", 0xFFFF)
        hi = hi if not ofm.fm.signed or hi < 0x8000 else hi - 0x10000
        if not fn and ofm.fm.bits < 64:  # the clip, then the type's saturation: one clamp
            return clamp_in_place(v, *clamp_bounds((lo, hi), type_range(ofm.fm.bits, ofm.fm.signed)))
        v = clamp_in_place(v, lo, hi)
    if fn:
        if fn not in _TABLES:
            raise NotModelled(f"activation {FUNCTIONS.get(fn, fn)} is not modelled")
        lut = np.frombuffer(constant_bytes(lut_ram, 0, LUT_RAM_BYTES, "LUT RAM"), np.uint8)  # alike per sample
        v = _lookup(lut, fn, table, v)
    return saturate(v, ofm.fm.bits, ofm.fm.signed) if not no_clip else wrap(v, ofm.fm.bits, ofm.fm.signed)


def wrap(v: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """Two's complement truncation to `bits` (no saturation)."""
    if bits >= 64:
        return v
    u = v & ((1 << bits) - 1)
    return np.where(u >= 1 << (bits - 1), u - (1 << bits), u) if signed else u
