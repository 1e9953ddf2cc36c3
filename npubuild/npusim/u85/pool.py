"""U85 POOL: MAX, MIN, AVERAGE, SUM, REDUCE_SUM, NONE and ARGMAX_X/Y over the kernel window.

AVERAGE divides by the number of non-padding elements under the window (TOSA's reciprocal: multiplier
(2^(31+k) + 2^k) / n, shift 31 + k, k = bits of n - 1, rounded half up) before the OFM scale; SUM leaves
the division to the OFM scale. REDUCE_SUM also sums over the IFM's depth into one channel. NONE passes
its input through (from IFM2 when ACC_FORMAT says so: how Vela rescales 32-bit tensors). ARGMAX puts the
first index of the window's maximum in bits 16 and up of the accumulator; Vela's OFM scale (1, 16)
takes it out. Vela also uses 1x1 SUM/NONE pools to copy, transpose, reverse and rescale.
"""

from __future__ import annotations

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim.npu_op import kernel_of, ofm_shape, taps
from npubuild.npusim.u85.machine_state import ACC_IFM2, Machine, OpResult, acc_format
from npubuild.npusim.u85.operands import operand, read
from npubuild.npusim.u85.scaling import NATURAL, scale
from npubuild.npusim.u85.window import padded_ifm

MODES = {0: "MAX", 1: "AVERAGE", 2: "REDUCE_SUM", 3: "SUM", 4: "NONE", 5: "MIN", 6: "ARGMAX_X", 7: "ARGMAX_Y"}
LOW, HIGH = -(1 << 62), 1 << 62  # padding values that never win a MAX / MIN


def reciprocal(count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TOSA's fixed-point 1/count: (multiplier, shift)."""
    kbits = np.array([int(c - 1).bit_length() for c in count.ravel()], np.int64).reshape(count.shape)
    mult = ((np.int64(1) << (31 + kbits)) + (np.int64(1) << kbits)) // count
    return mult, 31 + kbits


def _valid_counts(eshape, ishape, k, oh: int, ow: int) -> np.ndarray:
    valid = np.zeros((*eshape, 1), np.int64)
    valid[k.top:k.top + ishape[0], k.left:k.left + ishape[1]] = 1
    count = np.zeros((oh, ow, 1), np.int64)
    for _, _, win in taps(valid, k, oh, ow):
        count += win
    return np.maximum(count, 1)


def run_pool(m: Machine, cmd) -> OpResult:
    mode = MODES.get(cmd.param & 7)
    if mode is None:
        raise StageError(f"unknown pooling mode {cmd.param}")
    k = kernel_of(cmd)
    oh, ow, oc = ofm_shape(cmd)
    ifm = operand(cmd, "IFM")
    if mode == "NONE" and acc_format(cmd).source == ACC_IFM2:
        ifm2 = operand(cmd, "IFM2")
        acc = read(m.mem, m.chains, ifm2, oh, ow, oc) - ifm2.fm.zero_point
        return m.output(cmd, "POOL NONE", acc, (oh, ow, oc), ifm2, "from IFM2")
    depth = cmd.regs.get("IFM_DEPTH_M1", 0) + 1 if mode == "REDUCE_SUM" else oc
    pad = LOW if mode in ("MAX", "ARGMAX_X", "ARGMAX_Y") else HIGH if mode == "MIN" else None
    x, ishape = padded_ifm(m, cmd, ifm, k, oh, ow, depth, pad)
    zp = ifm.fm.zero_point
    if mode in ("MAX", "MIN"):
        pick = np.maximum if mode == "MAX" else np.minimum
        acc = None
        for _, _, win in taps(x, k, oh, ow):
            acc = win.copy() if acc is None else pick(acc, win)
        acc = acc - zp
    elif mode.startswith("ARGMAX"):
        best = index = None
        for ky, kx, win in taps(x, k, oh, ow):
            pos = ky if mode == "ARGMAX_Y" else kx
            if best is None:
                best, index = win.copy(), np.zeros(win.shape, np.int64)
            else:
                better = win > best  # the first maximum wins
                best, index = np.where(better, win, best), np.where(better, pos, index)
        acc = index << 16
    else:
        acc = None  # the first tap's values, then the others added
        for _, _, win in taps(x - zp, k, oh, ow):
            acc = win if acc is None else acc + win
        if mode == "REDUCE_SUM":
            acc = acc.sum(axis=-1, keepdims=True)
    if mode == "AVERAGE":
        rm, rs = reciprocal(_valid_counts(x.shape[-3:-1], ishape, k, oh, ow))
        acc = scale(acc, rm, rs, NATURAL)
    return m.output(cmd, f"POOL {mode}", acc, ishape, ifm, f"k{k.h}x{k.w} s{k.sy}x{k.sx}")
