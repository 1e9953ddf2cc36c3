"""U85 RESIZE: BILINEAR, NEAREST and REPLICATE sampling with TOSA's integer coordinates.

Per axis, the scale is n / d with n = RESIZE_*_SCALE_N_M1 + 1 and d = one_step_int * n + one_step_mod
(RESIZE_*_STEP), the offset RESIZE_*_OFFSET (signed); output position o reads input position
o * d + offset in units of 1/n, clamped to the IFM read (KERNEL_HEIGHT/WIDTH_M1 + 1). BILINEAR weighs
the four neighbours by (n - r) and r in each axis, NEAREST takes the nearer one (ties up), REPLICATE
the lower one; the accumulator carries 16 fraction bits, which Vela's OFM scale (1, 16 + shift) removes.
"""

from __future__ import annotations

import numpy as np

from npubuild.npusim.npu_op import ofm_shape
from npubuild.npusim.u85.machine_state import Machine, OpResult
from npubuild.npusim.u85.operands import operand, read

MODES = {0: "BILINEAR", 1: "REPLICATE", 2: "NEAREST"}
FRACTION_BITS = 16


def _axis(cmd, axis: str, out: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(lower index, upper index, remainder in 1/n, n) for each output position along one axis."""
    n = (cmd.regs.get(f"RESIZE_{axis}_SCALE_N_M1", 0) & 0x7FF) + 1
    step = cmd.regs.get(f"RESIZE_{axis}_STEP", 0)
    one_int = cmd.hi.get(f"RESIZE_{axis}_STEP", 0) & 0xF
    d = one_int * n + (step & 0x7FF)
    off = cmd.regs.get(f"RESIZE_{axis}_OFFSET", 0) & 0xFFF
    off = off - (1 << 12) if off >> 11 else off
    pos = np.arange(out, dtype=np.int64) * d + off
    lower = pos // n
    rem = pos - lower * n
    return np.clip(lower, 0, size - 1), np.clip(lower + 1, 0, size - 1), rem, n


def _at(x: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """x at rows ys and columns xs (leading axes: samples)."""
    return np.take(np.take(x, ys, axis=-3), xs, axis=-2)


def run_resize(m: Machine, cmd) -> OpResult:
    mode = MODES.get(cmd.param & 3, "BILINEAR")
    oh, ow, oc = ofm_shape(cmd)
    ih, iw = cmd.regs.get("KERNEL_HEIGHT_M1", 0) + 1, cmd.regs.get("KERNEL_WIDTH_M1", 0) + 1
    ifm = operand(cmd, "IFM")
    x = read(m.mem, m.chains, ifm, ih, iw, oc) - ifm.fm.zero_point
    y0, y1, ry, ny = _axis(cmd, "Y", oh, ih)
    x0, x1, rx, nx = _axis(cmd, "X", ow, iw)
    if mode == "BILINEAR":
        wy0, wy1 = (ny - ry)[:, None, None], ry[:, None, None]
        wx0, wx1 = (nx - rx)[None, :, None], rx[None, :, None]
        acc = (_at(x, y0, x0) * wy0 * wx0 + _at(x, y0, x1) * wy0 * wx1
               + _at(x, y1, x0) * wy1 * wx0 + _at(x, y1, x1) * wy1 * wx1)
    else:
        if mode == "NEAREST":
            ys, xs = np.where(2 * ry >= ny, y1, y0), np.where(2 * rx >= nx, x1, x0)
        else:
            ys, xs = y0, x0
        acc = _at(x, ys, xs)
    detail = f"{mode.lower()} {ih}x{iw} -> {oh}x{ow}"
    return m.output(cmd, f"RESIZE {mode}", acc << FRACTION_BITS, (ih, iw, oc), ifm, detail)
