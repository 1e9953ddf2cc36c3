"""Execute one Ethos-U55/U65 NPU operation (CONV, DEPTHWISE, POOL, ELEMENTWISE) on numpy arrays, vectorised.

Each op reads its operands from memory through `fmap`, computes the 32-bit
accumulator, applies the output scaling, zero point, activation and
saturation, and writes its OFM back.
"""

from __future__ import annotations

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim import NotModelled, VelaMiscompile, fmap
from npubuild.npusim.cmdstream import Command
from npubuild.npusim.memory import constant_bytes
from npubuild.npusim.npu_op import (
    Kernel,
    OpResult,
    clamp_bounds,
    clamp_in_place,
    clz,
    conv_accumulate,
    kernel_of,
    ofm_shape,
    taps,
    type_range,
)
from npubuild.npusim.u55.scaling import saturate, scale
from npubuild.npusim.weights import WeightLayout, decode_cached, decode_scales, unpack_weights

POOL_MODES = {0: "MAX", 1: "AVERAGE", 2: "REDUCE_SUM"}
EW_MODES = {0: "MUL", 1: "ADD", 2: "SUB", 3: "MIN", 4: "MAX", 5: "LRELU", 6: "ABS", 7: "CLZ", 8: "SHR", 9: "SHL"}
UNARY = ("LRELU", "ABS", "CLZ")
LUT_FIRST, LUT_LAST = 16, 23
LUT_SLOT_BYTES = 256
# (ofm micro-block depth, ifm micro-block depth) per accelerator
UBLOCKS = {"ethos-u55-32": (4, 8)}
INT64_MIN = int(np.iinfo(np.int64).min)  # a MAX pool's padding: below every value


def _upscale(cmd: Command) -> int:
    return cmd.regs.get("IFM_UPSCALE", 0) & 3


def _read_ifm_window(mem: dict, cmd: Command, k: Kernel, depth: int, pad_value: int | None):
    """The IFM with padding applied, as (padded array (..., H, W, C): leading axes are samples, real ifm shape);
    pad_value None pads with the zero point."""
    ifm = fmap.operand(cmd, "IFM")
    oh, ow, _ = ofm_shape(cmd)
    eh = (oh - 1) * k.sy + (k.h - 1) * k.dy + 1
    ew = (ow - 1) * k.sx + (k.w - 1) * k.dx + 1
    ih, iw = eh - k.top - k.bottom, ew - k.left - k.right
    up = _upscale(cmd)
    if up:
        src = fmap.read(mem[ifm.region], ifm, (ih + 1) // 2, (iw + 1) // 2, depth)
        if up == 1:
            x = np.repeat(np.repeat(src, 2, axis=-3), 2, axis=-2)[..., :ih, :iw, :]
        else:
            x = np.full((*src.shape[:-3], ih, iw, depth), ifm.zero_point, np.int64)
            x[..., ::2, ::2, :] = src[..., : (ih + 1) // 2, : (iw + 1) // 2, :]
    else:
        x = fmap.read(mem[ifm.region], ifm, ih, iw, depth)
    if not (k.top or k.left or k.bottom or k.right):  # the window is the IFM read (a new array)
        return x, (ih, iw, depth), ifm
    fill = ifm.zero_point if pad_value is None else pad_value
    padded = np.full((*x.shape[:-3], eh, ew, depth), fill, np.int64)
    padded[..., k.top:k.top + ih, k.left:k.left + iw, :] = x
    return padded, (ih, iw, depth), ifm


def _per_core_weights(mem: dict, cmd: Command, accel: str, ncores: int, oc: int, k: Kernel, ic: int,
                      depthwise: bool, ifm_bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decode the weight and scale streams of every core into OHWI weights and per-channel scales."""
    ofm_ub, ifm_ub = UBLOCKS.get(accel, (8, 8))
    blk = cmd.regs.get("OFM_BLK_DEPTH_M1", 0) + 1
    weights = np.zeros((oc, k.h, k.w, 1 if depthwise else ic), np.int64)
    bias = np.zeros(oc, np.int64)
    mult = np.zeros(oc, np.int64)
    shift = np.zeros(oc, np.int64)
    wregion = mem[cmd.regs.get("WEIGHT_REGION", 0) & 7]
    for core in range(min(ncores, oc)):
        sfx = "" if core == 0 else "1"
        chans = np.arange(core, oc, ncores)
        wbase, wlen = cmd.addr(f"WEIGHT{sfx}_BASE"), cmd.regs.get(f"WEIGHT{sfx}_LENGTH", 0)
        lay = WeightLayout(len(chans), k.h, k.w, 1 if depthwise else ic, (blk + ncores - 1 - core) // ncores,
                           depthwise, k.part_kernel, ifm_bits, ofm_ub, ifm_ub, 8 // k.dy, 8 // k.dx)
        stream = decode_cached(constant_bytes(wregion, wbase, wlen, "weights"))
        weights[chans] = unpack_weights(stream, lay)
    bias, mult, shift = channel_scales(mem, cmd, ncores, oc)
    return weights, bias, mult, shift


def channel_scales(mem: dict, cmd: Command, ncores: int, oc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-channel (bias, multiplier, shift) from the scale stream(s): core n holds channels n, n + ncores, ..."""
    bias = np.zeros(oc, np.int64)
    mult = np.zeros(oc, np.int64)
    shift = np.zeros(oc, np.int64)
    sregion = mem[cmd.regs.get("SCALE_REGION", 0) & 7]
    for core in range(min(ncores, oc)):
        sfx = "" if core == 0 else "1"
        chans = np.arange(core, oc, ncores)
        sbase, slen = cmd.addr(f"SCALE{sfx}_BASE"), cmd.regs.get(f"SCALE{sfx}_LENGTH", 0)
        b, m, s = decode_scales(constant_bytes(sregion, sbase, slen, "scales"), len(chans))
        bias[chans], mult[chans], shift[chans] = b, m, s
    return bias, mult, shift


def per_channel_mode(cmd: Command) -> bool:
    """OFM_PRECISION bit 8 clear: the output stage takes bias and scale per channel from the scale stream."""
    return not (cmd.regs.get("OFM_PRECISION", 0) >> 8) & 1


def _finish(cmd: Command, acc: np.ndarray, mult, shift, ofm: fmap.FeatureMap, mem: dict) -> np.ndarray:
    """Scale, add the OFM zero point, clamp to the activation range, look up a LUT, saturate to the OFM type."""
    p = cmd.regs.get("OFM_PRECISION", 0)
    rounding = (p >> 14) & 3
    v = scale(acc, mult, shift, rounding)  # a new array: the zero point and clamps go into it
    v += ofm.zero_point
    fn = cmd.regs.get("ACTIVATION", 0) & 0xFFF
    lo, hi = type_range(ofm.bits, ofm.signed)
    if ofm.bits < 32:  # the activation's range, then the type's: one clamp
        lo, hi = clamp_bounds((cmd.s16("ACTIVATION_MIN"), cmd.s16("ACTIVATION_MAX")), (lo, hi))
    v = clamp_in_place(v, lo, hi)
    if fn == 0:
        return v
    if LUT_FIRST <= fn <= LUT_LAST and ofm.bits == 8:
        table = lut_table(mem, fn - LUT_FIRST)
        idx = (v + 128) if ofm.signed else v
        out = table[idx.astype(np.int64)]
        return out if ofm.signed else out.astype(np.uint8).astype(np.int64)
    if LUT_FIRST <= fn <= LUT_LAST and ofm.bits == 16:
        return lut16(mem, v, ofm.signed)
    raise NotModelled(f"activation function {fn} on {ofm.bits}-bit OFM is not modelled yet")


def lut_table(mem: dict, slot: int) -> np.ndarray:
    """An 8-bit LUT: 256 signed bytes in the last 2 KiB of the internal memory, one slot per table."""
    internal = mem["internal"]
    base = internal.shape[-1] - 8 * LUT_SLOT_BYTES + slot * LUT_SLOT_BYTES
    return np.frombuffer(constant_bytes(internal, base, 256, "LUT"), np.int8).astype(np.int64)


def lut16(mem: dict, v: np.ndarray, signed: bool) -> np.ndarray:
    """16-bit LUT: 512 32-bit entries (base in the low half, slope in the high half), interpolated on 7 bits."""
    internal = mem["internal"]
    start = internal.shape[-1] - 8 * LUT_SLOT_BYTES
    raw = np.frombuffer(constant_bytes(internal, start, 8 * LUT_SLOT_BYTES, "LUT"), "<i4").astype(np.int64)
    u = (v + 32768) if signed else v
    idx, frac = u >> 7, u & 0x7F
    entry = raw[np.clip(idx, 0, 511)]
    base = ((entry & 0xFFFF) ^ 0x8000) - 0x8000
    slope = entry >> 16
    out = base + ((slope * frac + LUT16_ROUND) >> 7)
    return saturate(out, 16, signed)


LUT16_ROUND = 64  # the interpolation rounds half up, as TFLite's 16-bit LUT reference does


def _ofm_global_scale(cmd: Command) -> tuple[int, int]:
    return cmd.regs.get("OFM_SCALE", 1), cmd.hi.get("OFM_SCALE", 0) & 0x3F


def run_conv(mem: dict, cmd: Command, accel: str, ncores: int) -> OpResult:
    depthwise = cmd.kind == "DEPTHWISE"
    k = kernel_of(cmd)
    oh, ow, oc = ofm_shape(cmd)
    ic = oc if depthwise else cmd.regs.get("IFM_DEPTH_M1", 0) + 1
    padded, ishape, ifm = _read_ifm_window(mem, cmd, k, ic, None)
    x = padded - ifm.zero_point
    w, bias, mult, shift = _per_core_weights(mem, cmd, accel, ncores, oc, k, ic, depthwise, ifm.bits)
    acc = conv_accumulate(x, w, k, oh, ow, oc, depthwise)  # a new array
    acc += bias
    ofm = fmap.operand(cmd, "OFM")
    if not per_channel_mode(cmd):
        m, s = _ofm_global_scale(cmd)
        mult, shift = np.full(oc, m), np.full(oc, s)
    out = _finish(cmd, acc, mult, shift, ofm, mem)
    fmap.write(mem[ofm.region], ofm, out)
    detail = f"k{k.h}x{k.w} s{k.sy}x{k.sx} d{k.dy}x{k.dx} pad{(k.top, k.left, k.bottom, k.right)}"
    return OpResult(cmd.index, cmd.kind, ishape, ifm.format_name, (oh, ow, oc), ofm.format_name, detail, out,
                    ofm_bits=ofm.bits)


def _valid_count_scale(cmd: Command, eshape, ishape, k: Kernel) -> tuple[np.ndarray, np.ndarray]:
    """Per-position reciprocal of the valid (non-padding) element count, as multiplier and shift: from the
    registers alone, so made once per command (read only)."""
    got = cmd.derived.get("valid_count_scale")
    if got is None:
        oh, ow, _ = ofm_shape(cmd)
        got = cmd.derived["valid_count_scale"] = _count_scale(eshape, ishape, k, oh, ow)
    return got


def _count_scale(eshape, ishape, k: Kernel, oh: int, ow: int) -> tuple[np.ndarray, np.ndarray]:
    valid = np.zeros(eshape, np.int64)
    valid[k.top:k.top + ishape[0], k.left:k.left + ishape[1]] = 1
    count = np.zeros((oh, ow), np.int64)
    for _, _, win in taps(valid[..., None], k, oh, ow):
        count += win[..., 0]
    count = np.maximum(count, 1)
    kbits = np.array([int(c - 1).bit_length() for c in count.ravel()], np.int64).reshape(count.shape)
    mult = ((np.int64(1) << (31 + kbits)) + (np.int64(1) << kbits)) // count
    return mult[..., None], (31 + kbits)[..., None]


def run_pool(mem: dict, cmd: Command, ncores: int = 1) -> OpResult:
    mode = POOL_MODES.get(cmd.param & 0xFFFF)
    if mode is None:
        raise StageError(f"unknown pooling mode {cmd.param}")
    k = kernel_of(cmd)
    oh, ow, oc = ofm_shape(cmd)
    ifm0 = fmap.operand(cmd, "IFM")
    pad = INT64_MIN if mode == "MAX" else None
    # REDUCE_SUM also sums over the IFM's depth into one OFM channel
    depth = cmd.regs.get("IFM_DEPTH_M1", 0) + 1 if mode == "REDUCE_SUM" else oc
    padded, ishape, ifm = _read_ifm_window(mem, cmd, k, depth, pad)
    if mode == "MAX":
        acc = None
        for _, _, win in taps(padded, k, oh, ow):
            acc = win.copy() if acc is None else np.maximum(acc, win)
        acc = acc - ifm0.zero_point
    else:  # the first tap's values, then the others added (a 1x1 pool: the window less the zero point)
        acc = None
        for _, _, win in taps(padded - ifm0.zero_point, k, oh, ow):
            acc = win if acc is None else acc + win
        if mode == "REDUCE_SUM":
            acc = acc.sum(axis=-1, keepdims=True)
    ofm = fmap.operand(cmd, "OFM")
    m, s = _ofm_global_scale(cmd)
    if mode == "AVERAGE" and (k.top or k.left or k.bottom or k.right):
        # Windows over padding: the hardware divides by the number of valid elements at each position.
        m, s = _valid_count_scale(cmd, padded.shape[-3:-1], ishape, k)
    elif per_channel_mode(cmd) and cmd.regs.get("SCALE_LENGTH", 0):
        # A per-channel RESCALE Vela folds into a pool (e.g. a TOSA RESCALE with a multiplier per channel)
        bias, m, s = channel_scales(mem, cmd, ncores, oc)
        acc = acc + bias
    out = _finish(cmd, acc, m, s, ofm, mem)
    fmap.write(mem[ofm.region], ofm, out)
    return OpResult(cmd.index, f"POOL {mode}", ishape, ifm.format_name, (oh, ow, oc), ofm.format_name,
                    f"k{k.h}x{k.w} s{k.sy}x{k.sx}", out, ofm_bits=ofm.bits)


def _ifm2(mem: dict, cmd: Command, oh: int, ow: int, oc: int) -> tuple[np.ndarray, fmap.FeatureMap | None, int]:
    """IFM2 broadcast to the OFM shape (the 16-bit scalar: to the OFM shape; one read from memory: to its
    samples' OFM shapes), and its zero point."""
    b = cmd.regs.get("IFM2_BROADCAST", 0)
    if b >> 7 & 1:
        return np.full((oh, ow, oc), cmd.s16("IFM2_SCALAR"), np.int64), None, cmd.s16("IFM2_ZERO_POINT")
    fm = fmap.operand(cmd, "IFM2")
    h, w, c = (1 if b & 1 else oh), (1 if b >> 1 & 1 else ow), (1 if b >> 2 & 1 else oc)
    x = fmap.read(mem[fm.region], fm, h, w, c)
    return np.broadcast_to(x, (*x.shape[:-3], oh, ow, oc)), fm, fm.zero_point


def _require_full_ifm(cmd: Command, mode: str, ifm: fmap.FeatureMap, oshape: tuple[int, int, int]) -> None:
    """The U55/U65 broadcast IFM2 only: an elementwise op's IFM is read over the whole OFM shape.

    Vela 5.2 (regor) breaks this for a rank-5 TOSA ADD/SUB/MUL whose first operand is a [1,1,1,1,1] constant:
    it keeps the constant as a 1x1x1 IFM and flags the full IFM2 as broadcast (IFM2_BROADCAST 7, no operand
    reversal), so the hardware reads past the constant. Vela's own register generator asserts the opposite.
    """
    oh, ow, oc = oshape
    depth = cmd.regs.get("IFM_DEPTH_M1", 0) + 1
    single_tile = not any(ifm.bases[1:])
    point = single_tile and ifm.height0 == 1 and ifm.width0 == 1 and oh * ow > 1
    if depth < oc or point:
        ih, iw = (1, 1) if point else (ifm.height0, ifm.width0)
        raise VelaMiscompile(
            f"Vela miscompiled ELEMENTWISE {mode}: its IFM is {ih}x{iw}x{depth} for an OFM of {oh}x{ow}x{oc} "
            f"(IFM2_BROADCAST {cmd.regs.get('IFM2_BROADCAST', 0)}); the hardware broadcasts IFM2 only, so it would "
            "read past the IFM (known Vela 5.2 bug: a rank-5 binary op whose first operand is a [1,1,1,1,1] "
            "constant)")


def run_elementwise(mem: dict, cmd: Command) -> OpResult:
    mode = EW_MODES.get(cmd.param & 0xFFFF)
    if mode is None:
        raise StageError(f"unknown elementwise mode {cmd.param}")
    oh, ow, oc = ofm_shape(cmd)
    ifm = fmap.operand(cmd, "IFM")
    _require_full_ifm(cmd, mode, ifm, (oh, ow, oc))
    a = fmap.read(mem[ifm.region], ifm, oh, ow, oc) - (ifm.zero_point if ifm.bits < 32 else 0)
    ipr = cmd.regs.get("IFM_PRECISION", 0)
    scale_mode, in_round = (ipr >> 8) & 3, (ipr >> 14) & 3
    opa, opa_shift = cmd.regs.get("OPA_SCALE", 1), cmd.hi.get("OPA_SCALE", 0) & 0x3F
    opb = cmd.regs.get("OPB_SCALE", 1)
    ifm2_shape = None
    if mode in UNARY:
        b = np.zeros_like(a)
    else:
        b, fm2, zp2 = _ifm2(mem, cmd, oh, ow, oc)
        b = b - (zp2 if fm2 is None or fm2.bits < 32 else 0)
        ifm2_shape = b.shape[-3:]
        if cmd.regs.get("IFM2_BROADCAST", 0) >> 6 & 1:
            a, b = b, a
    if mode in ("ADD", "SUB"):
        if scale_mode == 0:
            a, b = a * opa, b * opb
        else:  # 32-bit scaling of one operand; the other is aligned by the fixed input shift
            align = 19 if ifm.bits == 8 else 14 if ifm.bits == 16 else 0
            if scale_mode == 1:
                a, b = scale(a, opa, opa_shift, in_round), b << align
            else:
                a, b = a << align, scale(b, opa, opa_shift, in_round)
    if mode == "ADD":
        acc = a + b
    elif mode == "SUB":
        acc = a - b
    elif mode == "MUL":
        acc = a * b
    elif mode == "MIN":
        acc = np.minimum(a, b)
    elif mode == "MAX":
        acc = np.maximum(a, b)
    elif mode == "ABS":
        acc = np.abs(a)
    elif mode == "CLZ":
        acc = clz(a)
    elif mode == "SHL":
        acc = (a << np.clip(b, 0, 31)) & 0xFFFFFFFF
        acc = np.where(acc >= 1 << 31, acc - (1 << 32), acc)
    elif mode == "SHR":
        acc = scale(a, 1, np.clip(b, 0, 31), (cmd.regs.get("OFM_PRECISION", 0) >> 14) & 3)
    else:
        raise NotModelled(f"ELEMENTWISE {mode} is not modelled yet")
    ofm = fmap.operand(cmd, "OFM")
    m, s = _ofm_global_scale(cmd)
    if mode in ("SHL", "SHR", "CLZ"):
        m, s = 1, 0
    out = _finish(cmd, acc, m, s, ofm, mem)
    fmap.write(mem[ofm.region], ofm, out)
    return OpResult(cmd.index, f"ELEMENTWISE {mode}", (oh, ow, oc), ifm.format_name, (oh, ow, oc), ofm.format_name,
                    "scalar" if ifm2_shape is not None and cmd.regs.get("IFM2_BROADCAST", 0) >> 7 & 1 else "", out,
                    ifm2_shape, ofm.bits)
