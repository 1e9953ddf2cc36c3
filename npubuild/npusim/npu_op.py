"""What an NPU operation of every generation shares: its kernel and OFM shape as its registers give them, the
record of what it wrote (OpResult), a run's result (SimResult), one op's step of a run (`traced`), the kernel's
taps over the IFM and a convolution's exact integer accumulation, and the count of leading zeros of the
elementwise CLZ."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim.cmdstream import Command


@dataclass(frozen=True)
class Kernel:
    """Kernel size, stride, dilation, weight order and IFM padding of one op, decoded from its registers."""

    h: int
    w: int
    sy: int
    sx: int
    dy: int
    dx: int
    part_kernel: bool
    top: int
    left: int
    bottom: int
    right: int


def kernel_of(cmd: Command) -> Kernel:
    """KERNEL_STRIDE: bit 0/1 stride x/y low bits, 2 part-kernel-first, 3/4 dilation x/y, 6/9 stride x/y high bits.

    KERNEL_WIDTH/HEIGHT_M1 hold the dilated extent minus one. Made once per command (callers only read it):
    a U55 stream of thousands of small ops spends a tenth of its time decoding these again per sample.
    """
    k = cmd.derived.get("kernel")
    if k is None:
        k = cmd.derived["kernel"] = _kernel(cmd)
    return k


def _kernel(cmd: Command) -> Kernel:
    p = cmd.regs.get("KERNEL_STRIDE", 0)
    sx = ((p & 1) | ((p >> 6) & 1) << 1) + 1
    sy = (((p >> 1) & 1) | ((p >> 9) & 1) << 1) + 1
    dx, dy = ((p >> 3) & 1) + 1, ((p >> 4) & 1) + 1
    r = cmd.regs
    return Kernel(r.get("KERNEL_HEIGHT_M1", 0) // dy + 1, r.get("KERNEL_WIDTH_M1", 0) // dx + 1, sy, sx, dy, dx,
                  bool(p >> 2 & 1), r.get("IFM_PAD_TOP", 0), r.get("IFM_PAD_LEFT", 0),
                  r.get("IFM_PAD_BOTTOM", 0), r.get("IFM_PAD_RIGHT", 0))


@dataclass
class OpResult:
    """What one op did, for the listing and for op-by-op comparison."""

    index: int
    kind: str
    ifm_shape: tuple[int, int, int]
    ifm_format: str
    ofm_shape: tuple[int, int, int]
    ofm_format: str
    detail: str
    ofm: np.ndarray
    ifm2_shape: tuple[int, int, int] | None = None
    ofm_bits: int = 8


def ofm_shape(cmd: Command) -> tuple[int, int, int]:
    """The OFM's (height, width, depth), made once per command as `kernel_of` is."""
    shape = cmd.derived.get("ofm_shape")
    if shape is None:
        r = cmd.regs
        shape = cmd.derived["ofm_shape"] = (r.get("OFM_HEIGHT_M1", 0) + 1, r.get("OFM_WIDTH_M1", 0) + 1,
                                            r.get("OFM_DEPTH_M1", 0) + 1)
    return shape


@dataclass
class SimResult:
    """A command stream's run: the graph outputs and, op by op, what each NPU operation wrote."""

    outputs: list[np.ndarray]
    ops: list[OpResult] = field(default_factory=list)


def traced(trace: list[OpResult], cmd: Command, run: Callable[[], OpResult], keep_ofms: bool) -> None:
    """Run one NPU op and add what it wrote to the run's trace (without its OFM unless `keep_ofms`); an error
    names the op by its place in the trace."""
    try:
        res = run()
    except StageError as exc:
        raise type(exc)(f"NPU op #{len(trace)} {cmd.kind}: {exc.message}") from None
    if not keep_ofms:
        res.ofm = np.zeros(0)
    trace.append(res)


def sample_trace(trace: list[OpResult], row: int, keep_ofms: bool) -> list[OpResult]:
    """One sample's op trace from a batch's: its row of every OFM (an OFM dropped stays dropped)."""
    if not keep_ofms:
        return list(trace)
    return [replace(op, ofm=op.ofm[row]) for op in trace]


def clz(a: np.ndarray) -> np.ndarray:
    """Leading zeros of each value's low 32 bits (32 for 0)."""
    u = (a & 0xFFFFFFFF).astype(np.uint64)
    n = np.full(u.shape, 32, np.int64)
    for bit in range(32):
        n = np.where((u >> np.uint64(bit)) != 0, 31 - bit, n)
    return n


def taps(padded: np.ndarray, k: Kernel, oh: int, ow: int):
    """Yield (ky, kx, view of shape (..., oh, ow, c)) for every kernel tap (leading axes: samples)."""
    for ky in range(k.h):
        for kx in range(k.w):
            y0, x0 = ky * k.dy, kx * k.dx
            yield ky, kx, padded[..., y0:y0 + (oh - 1) * k.sy + 1:k.sy, x0:x0 + (ow - 1) * k.sx + 1:k.sx, :]


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer matrix product via float64 when every partial sum is exact (|sum| < 2^53), else int64."""
    bound = float(np.abs(a).max(initial=0)) * float(np.abs(b).max(initial=0)) * a.shape[1]
    if bound < 2.0 ** 52:
        return np.rint(a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)
    return a.astype(np.int64) @ b.astype(np.int64)


def conv_accumulate(x: np.ndarray, w: np.ndarray, k: Kernel, oh: int, ow: int, oc: int,
                    depthwise: bool) -> np.ndarray:
    """The int64 accumulators (..., oh, ow, oc) of a convolution of the zero-point-removed IFM `x` (padded,
    (..., H, W, C): leading axes are samples) with OHWI weights `w`: per tap for a depthwise one, as one matrix
    product over every tap otherwise (exact, so its rows do not depend on how many samples share it). A new
    array (the caller may add to it in place).

    Both in the narrowest arithmetic that holds every partial sum exactly, by the bound |x| |w| taps (x's
    own extremes): a depthwise sum in int32 (else int64), a product in float32 below 2^24 (else float64, else
    int64). Exact in each, so the same integers; most of a real model's npu-sim time is these sums, and int64
    moves twice the bytes."""
    shape = (*x.shape[:-3], oh, ow, oc)
    n_taps = k.h * k.w
    if depthwise and n_taps == 1:
        return next(taps(x, k, oh, ow))[2] * w[:, 0, 0, 0]
    bound = _magnitude(x) * _magnitude(w) * (n_taps if depthwise else n_taps * x.shape[-1])
    if depthwise:
        return _depthwise(x, w, k, oh, ow, shape, np.int32 if bound < 2 ** 31 else np.int64)
    dtype = np.float32 if bound < 2 ** 24 else np.float64 if bound < 2 ** 52 else np.int64
    cols = np.concatenate([win for _, _, win in taps(x, k, oh, ow)], axis=-1, dtype=dtype)
    wmat = w.transpose(1, 2, 3, 0).reshape(-1, oc).astype(dtype)
    return (cols.reshape(-1, cols.shape[-1]) @ wmat).astype(np.int64).reshape(shape)


def _magnitude(a: np.ndarray) -> int:
    """The greatest |element| (0 for an empty array), from the extremes (no array of absolute values)."""
    if not a.size:
        return 0
    return max(int(a.max()), -int(a.min()))


def _depthwise(x: np.ndarray, w: np.ndarray, k: Kernel, oh: int, ow: int, shape: tuple[int, ...],
               dtype: type) -> np.ndarray:
    """Sum over taps of the window times the tap's weight per channel, in `dtype` (exact there), as int64."""
    xs, ws = x.astype(dtype), w.astype(dtype)
    acc: np.ndarray | None = None
    product = np.empty(shape, dtype)
    for ky, kx, win in taps(xs, k, oh, ow):
        if acc is None:
            acc = win * ws[:, ky, kx, 0]
        else:
            np.multiply(win, ws[:, ky, kx, 0], out=product)
            acc += product
    assert acc is not None
    return acc.astype(np.int64, copy=False)


def type_range(bits: int, signed: bool) -> tuple[int, int]:
    """The least and greatest value of a `bits`-wide integer."""
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def clamp_bounds(first: tuple[int, int], then: tuple[int, int]) -> tuple[int, int]:
    """(lo, hi) such that clamp(v, lo, hi) is clamp(clamp(v, *first), *then) for every v: max distributes over
    min, so min(max(min(max(v, a), b), c), d) = min(max(v, max(a, c)), min(max(b, c), d)) (also where a
    range is empty, as the activation's may be)."""
    (a, b), (c, d) = first, then
    return max(a, c), min(max(b, c), d)


def clamp_in_place(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """`clamp` into `values` itself (an array the caller made): two passes without new arrays."""
    np.maximum(values, lo, out=values)
    np.minimum(values, hi, out=values)
    return values
