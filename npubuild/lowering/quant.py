"""Integer arithmetic helpers shared by every integer lowering.

One place turns a real scale into TOSA's (multiplier, shift) pair so that all
ops round the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

INT4 = np.dtype(ml_dtypes.int4)  # 4-bit weights (EXT-INT4), held by numpy as ml_dtypes.int4
INT48 = np.dtype(np.int64)  # TOSA's 48-bit accumulator of a 16-bit activation (EXT-INT16), held in int64
INT48_MIN, INT48_MAX = -(1 << 47), (1 << 47) - 1


def int_range(dtype: np.dtype) -> tuple[int, int]:
    """The integers a storage type holds (int4 is not a numpy integer type: ml_dtypes knows it)."""
    dtype = np.dtype(dtype)
    info = ml_dtypes.iinfo(dtype) if dtype == INT4 else np.iinfo(dtype)
    return int(info.min), int(info.max)


def accumulator(dtype: np.dtype) -> np.dtype:
    """What a convolution or MATMUL of an int8 or int16 activation accumulates in: int32, or TOSA's int48."""
    return INT48 if np.dtype(dtype) == np.int16 else np.dtype(np.int32)


@dataclass(frozen=True)
class QParams:
    """Affine quantisation of a tensor: real = scale * (q - zero_point); per-tensor or per-axis."""

    scale: np.ndarray  # float64, shape () or (n,)
    zero_point: np.ndarray  # int64, same shape as scale
    dtype: np.dtype  # storage type: int8, uint8, int16 or int32
    axis: int | None = None

    @property
    def is_per_tensor(self) -> bool:
        return self.scale.ndim == 0 or self.scale.size == 1

    @property
    def s(self) -> float:
        """The per-tensor scale (only valid when is_per_tensor)."""
        return float(self.scale.reshape(-1)[0])

    @property
    def zp(self) -> int:
        return int(self.zero_point.reshape(-1)[0])

    @property
    def qmin(self) -> int:
        return int_range(self.dtype)[0]

    @property
    def qmax(self) -> int:
        return int_range(self.dtype)[1]

    @property
    def bits(self) -> int:
        return 4 if self.dtype == INT4 else 8 * self.dtype.itemsize

    def same_as(self, other: QParams | None) -> bool:
        return (
            other is not None
            and self.dtype == other.dtype
            and self.scale.shape == other.scale.shape
            and _close_scales(self.scale, other.scale)
            and np.array_equal(self.zero_point, other.zero_point)
        )

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """Constants the lowering writes into the graph (per-tensor or per-axis, float64): graph inputs and outputs are
        quantised by tosa.iospec.IOSpec, which divides in the feed's own precision as the reference does."""
        q = np.round(np.asarray(x, np.float64) / self.scale) + self.zero_point
        return np.clip(q, self.qmin, self.qmax).astype(np.int64).astype(self.dtype)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return (np.asarray(q, np.float64) - self.zero_point) * self.scale


def _close_scales(a: np.ndarray, b: np.ndarray) -> bool:
    """np.allclose(a, b, rtol=1e-6, atol=0); for one finite float64 scale each (most tensors) its formula on
    Python floats, which round alike, without numpy's per-call cost."""
    if a.size == 1 and b.size == 1 and a.dtype == np.float64 and b.dtype == np.float64:
        x, y = float(a.reshape(-1)[0]), float(b.reshape(-1)[0])
        if math.isfinite(x) and math.isfinite(y):
            return abs(x - y) <= 1e-6 * abs(y)
    return bool(np.allclose(a, b, rtol=1e-6, atol=0))


class UnrepresentableScale(ValueError):
    """A scale no TOSA RESCALE can apply (zero, negative, not finite, too large): e.g. a tensor calibrated to a
    constant, or to inf. The driver reports it as the node's own limit, which puts the node on the host."""


def multiplier_shift(scale: float | np.ndarray, bits: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Represent `scale` as multiplier * 2**-shift with a `bits`-bit multiplier, TOSA's RESCALE form.

    TOSA requires 2 <= shift <= 62; tiny scales are flushed to a zero multiplier
    (the result is 0 either way). Vectorised over the channels (a Python loop per channel was a third of
    palm detection's lowering, which lowers a few thousand per-channel RESCALEs once per variant); an
    unrepresentable scale fails on the first one in channel order, as the loop did.
    """
    scale = np.atleast_1d(np.asarray(scale, np.float64))
    mantissa_bits = bits - 1
    if scale.size == 1:  # most RESCALEs: the same arithmetic on one Python float, without numpy's per-call cost
        one = _one_multiplier_shift(float(scale[0]), mantissa_bits)
        if one is not None:
            return np.array([one[0]], np.int64), np.array([one[1]], np.int64)
    invalid = (scale <= 0) | ~np.isfinite(scale)
    m, e = np.frexp(np.where(invalid, 0.5, scale))  # s = m * 2**e, 0.5 <= m < 1 (exact)
    mult = np.round(m * (1 << mantissa_bits)).astype(np.int64)  # at most 2**mantissa_bits: exact in float64
    carry = mult == (1 << mantissa_bits)
    mult = np.where(carry, mult // 2, mult)
    shift = mantissa_bits - (e.astype(np.int64) + carry)
    tiny = shift > 62  # too small to represent: shift the multiplier down
    mult = np.where(tiny, mult >> np.minimum(np.maximum(shift - 62, 0), 63), mult)
    shift = np.where(tiny, 62, shift)
    bad = invalid | (shift < 2)
    if bad.any():
        i = int(np.argmax(bad))
        s = scale[i]
        if invalid[i]:
            raise UnrepresentableScale(f"rescale factor must be positive and finite, got {s}")
        raise UnrepresentableScale(f"rescale factor {s} is too large for a {bits}-bit RESCALE")
    return mult, shift


def _one_multiplier_shift(scale: float, mantissa_bits: int) -> tuple[int, int] | None:
    """multiplier_shift of one scale, exactly as the vectorised form computes it (frexp, round half to even);
    None when it cannot be represented (the vectorised form raises the error)."""
    if not (scale > 0 and math.isfinite(scale)):
        return None
    m, e = math.frexp(scale)
    mult = round(m * (1 << mantissa_bits))
    carry = mult == 1 << mantissa_bits
    if carry:
        mult //= 2
    shift = mantissa_bits - (e + carry)
    if shift > 62:
        mult >>= min(shift - 62, 63)
        shift = 62
    return (mult, shift) if shift >= 2 else None
