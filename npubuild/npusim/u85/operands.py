"""U85 operands from the register snapshot: storage (TILE2X2, CHAINED, NONE), precision, and the OFM's write.

IFM/IFM2/OFM_PRECISION (parameter bits): 0 signed, 2-3 (IFM) or 1-2 (OFM) precision B8/B16/B32/B64,
6-7 NHWC/NHCWB16, 14-15 storage; the OFM's also 8 global scale, 9-10 reverse (H, W, C), 11-13
transpose. TILE2X2 is the four-tile layout of U55 (npusim.fmap); a CHAINED operand lives in a
chaining buffer named by the REGION register instead of memory; NONE is a scalar input (OP_SCALAR)
or an output that stays in the accumulator. TILE3X1 (three tiles side by side) is not emitted by
Vela and not modelled. An OFM is computed in its pre-transpose shape (OFM_HEIGHT/WIDTH/DEPTH) and
written permuted (WHC: out[x, y, c] = v[y, x, c], and so on) or reversed along one axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim import NotModelled, fmap
from npubuild.npusim.cmdstream import Command

TILE2X2, TILE3X1, CHAINED, NONE = 0, 1, 2, 3
STORAGE_NAMES = {TILE2X2: "TILE2X2", TILE3X1: "TILE3X1", CHAINED: "CHAINED", NONE: "NONE"}
# output axis order of each ACTIVATION_TRANSPOSE value, as indices into (H, W, C)
TRANSPOSES = {0: (0, 1, 2), 1: (1, 0, 2), 2: (0, 2, 1), 3: (1, 2, 0), 6: (2, 0, 1), 7: (2, 1, 0)}
TRANSPOSE_NAMES = {0: "HWC", 1: "WHC", 2: "HCW", 3: "WCH", 6: "CHW", 7: "CWH"}
REVERSE_AXES = {1: -3, 2: -2, 3: -1}  # H, W, C (leading axes are samples)


@dataclass
class Operand:
    """One operand: its feature map (memory layout, type, zero point) and where it is stored."""

    fm: fmap.FeatureMap
    storage: int

    @property
    def chain(self) -> int:
        return self.fm.region

    @property
    def label(self) -> str:
        return "CHAINED" if self.storage == CHAINED else self.fm.format_name


@dataclass
class OfmLayout:
    """How an OFM block is written: transpose (output axis order) and reverse (axis or None)."""

    transpose: int
    reverse: int

    @property
    def axes(self) -> tuple[int, int, int]:
        return TRANSPOSES[self.transpose]


def _bits(precision: int) -> int:
    return {0: 8, 1: 16, 2: 32, 3: 64}[precision]


def operand(cmd: Command, prefix: str) -> Operand:
    """IFM, IFM2 or OFM from the snapshot."""
    p = cmd.regs.get(f"{prefix}_PRECISION", 0)
    ofm = prefix == "OFM"
    bits = _bits((p >> 1) & 3 if ofm else (p >> 2) & 3)
    storage = (p >> 14) & 3
    if storage == TILE3X1:
        raise NotModelled(f"{prefix} storage TILE3X1 is not modelled (Vela does not emit it)")
    r = cmd.regs
    fm = fmap.FeatureMap(
        region=r.get(f"{prefix}_REGION", 0) & 0x7,
        bases=tuple(cmd.addr(f"{prefix}_BASE{i}") for i in range(4)),  # type: ignore[arg-type]
        width0=r.get(f"{prefix}_WIDTH0_M1", 0) + 1,
        height0=r.get(f"{prefix}_HEIGHT0_M1", 0) + 1,
        height1=r.get(f"{prefix}_HEIGHT1_M1", 0) + 1,
        stride_x=cmd.addr(f"{prefix}_STRIDE_X"), stride_y=cmd.addr(f"{prefix}_STRIDE_Y"),
        stride_c=cmd.addr(f"{prefix}_STRIDE_C"),
        bits=bits, signed=bool(p & 1), fmt=(p >> 6) & 3, zero_point=cmd.s16(f"{prefix}_ZERO_POINT"),
    )
    if fm.zero_point < 0 and not fm.signed:
        fm.zero_point += 1 << 16  # an unsigned 16-bit zero point
    return Operand(fm, storage)


def ofm_layout(cmd: Command) -> OfmLayout:
    p = cmd.regs.get("OFM_PRECISION", 0)
    transpose, reverse = (p >> 11) & 7, (p >> 9) & 3
    if transpose not in TRANSPOSES:
        raise StageError(f"unknown OFM transpose {transpose}")
    return OfmLayout(transpose, reverse)


class Chains(dict):
    """Chaining buffer index -> the (..., h, w, c) values the last op chained there (leading axes: samples)."""

    def take(self, index: int, h: int, w: int, c: int) -> np.ndarray:
        if index not in self:
            raise StageError(f"chained operand reads chaining buffer {index}, which no earlier op wrote")
        v = self[index]
        if v.shape[-3] < h or v.shape[-2] < w or v.shape[-1] < c:
            raise StageError(f"chaining buffer {index} holds {list(v.shape[-3:])}, the op reads {[h, w, c]}")
        return v[..., :h, :w, :c]


def read(mem: dict, chains: Chains, op: Operand, h: int, w: int, c: int) -> np.ndarray:
    """The (h, w, c) block at the origin of an operand, as int64 (one per sample for a batched memory)."""
    if op.storage == CHAINED:
        return chains.take(op.chain, h, w, c)
    if op.storage == NONE:
        raise StageError("reading an operand with storage NONE")
    return fmap.read(mem[op.fm.region], op.fm, h, w, c)


def write(mem: dict, chains: Chains, op: Operand, layout: OfmLayout, values: np.ndarray) -> np.ndarray:
    """Store an OFM block (already in the OFM's type): chained, or reversed/transposed into memory.

    Returns the block as stored (in the output's axis order)."""
    if op.storage == CHAINED:
        chains[op.chain] = values
        return values
    if layout.reverse:
        values = np.flip(values, axis=REVERSE_AXES[layout.reverse])
    if layout.transpose:
        lead = values.ndim - 3
        values = values.transpose((*range(lead), *(lead + a for a in layout.axes)))
    values = np.ascontiguousarray(values)
    if op.storage != NONE:
        fmap.write(mem[op.fm.region], op.fm, values)
    return values
