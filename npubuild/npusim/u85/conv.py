"""U85 CONV and DEPTHWISE: weight-stream convolutions and matmul (CONV with weights_ifm2: IFM2 as the weights).

The IFM window (padding with the zero point, NEAREST/ZEROS upscale) and the per-tap accumulation
are U55's; the weights come from the U85 streams (u85/weights.py) of every core, the biases and
per-channel scales from one scale stream. A matmul reads IFM2 as (h2, n, k) and computes
OFM[y, x, n] = sum_k (IFM[y, x, k] - zp) * (IFM2[y2, n, k] - zp2), y2 = y (or 0 when IFM2 has one row),
with the global OFM scale. ACC_FORMAT picks the accumulator (32/48 bits), its source (reset, kept
from the previous op, or IFM2) and whether it is output at all (machine_state.Machine.output).
"""

from __future__ import annotations

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim.memory import constant_bytes
from npubuild.npusim.npu_op import Kernel, conv_accumulate, kernel_of, ofm_shape
from npubuild.npusim.u85 import weights as wts
from npubuild.npusim.u85.machine_state import ACC_IFM2, Machine, OpResult, acc_format
from npubuild.npusim.u85.operands import operand, read
from npubuild.npusim.u85.window import padded_ifm
from npubuild.npusim.weights import decode_cached as decode_swd

# (macs, MICROBLOCK) -> OFM micro-block depth; each configuration's micro-blocks differ in H x W
UBLOCK_DEPTH = {
    (128, 1): 8, (128, 0): 16, (256, 3): 8, (256, 2): 8, (256, 1): 16, (512, 3): 16, (512, 2): 16,
    (1024, 3): 32, (1024, 2): 32, (1024, 4): 16, (2048, 3): 64, (2048, 2): 64, (2048, 5): 16,
}


def _layout(m: Machine, cmd, k: Kernel, oc: int, ic: int, depthwise: bool, ifm_bits: int) -> wts.Layout:
    micro = acc_format(cmd).microblock
    key = (m.macs, micro)
    if key not in UBLOCK_DEPTH:
        raise StageError(f"microblock {micro} is not valid on an Ethos-U85-{m.macs}")
    oub = UBLOCK_DEPTH[key]
    sparse = bool((cmd.regs.get("WEIGHT_FORMAT", 0) >> 4) & 1)
    traversal = wts.DEPTHWISE if depthwise else wts.PART_KERNEL if k.part_kernel else wts.DEPTH_FIRST
    ibd = wts.ifm_block_depth(k.part_kernel, ifm_bits, m.macs, oub, sparse)
    return wts.Layout(oc, k.h, k.w, 1 if depthwise else ic, traversal, ifm_bits, m.macs, m.ncores,
                      cmd.regs.get("OFM_BLK_DEPTH_M1", 0) + 1, oub, ibd, k.sy, k.sx, k.dy, k.dx, sparse)


def weights_of(m: Machine, cmd, k: Kernel, oc: int, ic: int, depthwise: bool, ifm_bits: int) -> np.ndarray:
    """The op's OHWI weights (OHW1 for depthwise) decoded from its weight stream(s)."""
    lay = _layout(m, cmd, k, oc, ic, depthwise, ifm_bits)
    region = m.mem[cmd.regs.get("WEIGHT_REGION", 0) & 7]
    shape = (oc, k.h, k.w, 1 if depthwise else ic)
    fast = cmd.regs.get("WEIGHT_FORMAT", 0) & 1
    if fast:
        base, length = cmd.addr("WEIGHT_BASE"), cmd.regs.get("WEIGHT_LENGTH", 0)
        order = wts.fwd_order(lay)
        values = wts.decode_fwd(constant_bytes(region, base, length, "weights"), len(order))
        return wts.unpack(values, order, shape)
    out = np.zeros(shape, np.int64)
    for core in range(m.ncores):
        sfx = "" if core == 0 else str(core)
        base, length = cmd.addr(f"WEIGHT{sfx}_BASE"), cmd.regs.get(f"WEIGHT{sfx}_LENGTH", 0)
        if not length:
            continue
        values = decode_swd(constant_bytes(region, base, length, "weights"))
        out += wts.unpack(values, wts.stream_order(lay, core), shape)
    return out


def run_conv(m: Machine, cmd) -> OpResult:
    depthwise = cmd.kind == "DEPTHWISE"
    matmul = not depthwise and bool(cmd.param & 1)
    k = kernel_of(cmd)
    oh, ow, oc = ofm_shape(cmd)
    ic = oc if depthwise else cmd.regs.get("IFM_DEPTH_M1", 0) + 1
    ifm = operand(cmd, "IFM")
    x, ishape = padded_ifm(m, cmd, ifm, k, oh, ow, ic, None)
    x = x - ifm.fm.zero_point
    if matmul:
        ifm2 = operand(cmd, "IFM2")
        rows = 1 if ifm2.fm.height0 == 1 else oh  # one weight matrix for all rows, or one per row
        w2 = read(m.mem, m.chains, ifm2, rows, oc, ic) - ifm2.fm.zero_point  # (..., rows, n, k)
        acc = _exact_matmul_rows(x[..., :oh, :ow, :], np.broadcast_to(w2, (*w2.shape[:-3], oh, oc, ic)))
        kind = "MATMUL"
    else:
        w = weights_of(m, cmd, k, oc, ic, depthwise, ifm.fm.bits)
        acc = conv_accumulate(x, w, k, oh, ow, oc, depthwise)
        kind = cmd.kind
    if acc_format(cmd).source == ACC_IFM2 and not matmul:
        ifm2 = operand(cmd, "IFM2")
        acc = acc + read(m.mem, m.chains, ifm2, oh, ow, oc)
    detail = f"k{k.h}x{k.w} s{k.sy}x{k.sx} d{k.dy}x{k.dx} pad{(k.top, k.left, k.bottom, k.right)}"
    return m.output(cmd, kind, acc, ishape, ifm, detail)


def _exact_matmul_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row y: (x, k) @ (n, k)^T, exactly (leading axes: samples; exact whichever way, so a sample's rows do
    not depend on the batch)."""
    bound = float(np.abs(a).max(initial=0)) * float(np.abs(b).max(initial=0)) * a.shape[-1]
    if bound < 2.0 ** 52:
        return np.rint(np.einsum("...yxk,...ynk->...yxn", a.astype(np.float64), b.astype(np.float64))).astype(np.int64)
    return np.einsum("...yxk,...ynk->...yxn", a.astype(np.int64), b.astype(np.int64))

