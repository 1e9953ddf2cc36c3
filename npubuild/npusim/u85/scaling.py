"""U85 fixed-point scaling: (v * scale + round) >> shift with the six OFM rounding modes and a double-round position.

The rounding term is 1 << (shift - 1) (NATURAL, round half up), adjusted per mode: DOUBLE_SYMMETRIC
adds +-D by the sign of v and DOUBLE_ASYMMETRIC adds D, where D = 1 << (30 - dbl_rnd) when
shift > 31 - dbl_rnd (TOSA's DOUBLE_ROUND for dbl_rnd 0); SYMMETRIC rounds half away from zero,
TRUNCATE_TO_ZERO and TRUNCATE_TO_LOWER drop the fraction towards zero or downwards. This is the
arithmetic Vela's own constant folding uses for these registers. IFM scales use the first two modes.
The product can exceed 64 bits (48-bit accumulators times 31-bit scales), so large values take an
exact two-limb path.
"""

from __future__ import annotations

import numpy as np

DOUBLE_SYMMETRIC, NATURAL, DOUBLE_ASYMMETRIC, SYMMETRIC, TRUNCATE_TO_ZERO, TRUNCATE_TO_LOWER = range(6)
ROUND_NAMES = ("DOUBLE_SYMMETRIC", "NATURAL", "DOUBLE_ASYMMETRIC", "SYMMETRIC", "TRUNCATE_TO_ZERO",
               "TRUNCATE_TO_LOWER")
_LIMB = 24


def _rounding(v: np.ndarray, shift: np.ndarray, mode: int, dbl: int) -> np.ndarray:
    one = np.int64(1)
    half = np.where(shift > 0, one << np.maximum(shift - 1, 0), 0)
    if mode == NATURAL:
        return half
    if mode in (DOUBLE_SYMMETRIC, DOUBLE_ASYMMETRIC):
        d = np.where(shift > 31 - dbl, one << max(30 - dbl, 0), 0)
        return half + (np.where(v >= 0, d, -d) if mode == DOUBLE_SYMMETRIC else d)
    if mode == SYMMETRIC:
        return half - ((v < 0) & (shift > 0))
    if mode == TRUNCATE_TO_ZERO:
        return np.where(v >= 0, 0, (one << shift) - 1)
    if mode == TRUNCATE_TO_LOWER:
        return np.zeros_like(half)
    raise ValueError(f"unknown rounding mode {mode}")


def scale(value, mult, shift, mode: int, dbl: int = 0) -> np.ndarray:
    """The scaled value, exactly, as int64 (the caller saturates)."""
    v = np.asarray(value, np.int64)
    m = np.asarray(mult, np.int64)
    s = np.asarray(shift, np.int64)
    in_place = _scale_in_place(v, m, s, mode, dbl)
    if in_place is not None:
        return in_place
    rnd = np.asarray(_rounding(v, s, mode, dbl))
    if _magnitude(v) * _magnitude(m) + _magnitude(rnd) < (1 << 63):
        return (v * m + rnd) >> s
    # v * m + rnd = hi * 2^24 + low, each part computed well inside 64 bits
    mask = (1 << _LIMB) - 1
    hi = (v >> _LIMB) * m + (rnd >> _LIMB)
    low = (v & mask) * m + (rnd & mask)
    hi = hi + (low >> _LIMB)
    low = low & mask
    big = s >= _LIMB
    out_big = hi >> np.maximum(s - _LIMB, 0)
    # shift < 24: hi * 2^(24 - s) may pass 64 bits; clamp hi to keep it within 2^62 (far past any OFM type)
    small_s = np.minimum(s, _LIMB)
    limit = np.int64(1) << (38 + small_s)
    hi_c = np.clip(hi, -limit, limit)
    out_small = (hi_c << (_LIMB - small_s)) + (low >> small_s)
    return np.where(big, out_big, out_small)


def _scale_in_place(v: np.ndarray, m: np.ndarray, s: np.ndarray, mode: int, dbl: int) -> np.ndarray | None:
    """`scale`'s one-word path, the rounding term added into the product part by part (the per-channel half,
    then the per-element sign or truncation term) rather than made whole and added: where a bound on the term
    from its per-channel parts shows v * m + round within 64 bits (then `scale` takes that path too: the exact
    term is within the bound), else None. A new array (the caller may change it)."""
    one = np.int64(1)
    half = np.where(s > 0, one << np.maximum(s - 1, 0), 0)
    d = np.where(s > 31 - dbl, one << max(30 - dbl, 0), 0) if mode in (DOUBLE_SYMMETRIC, DOUBLE_ASYMMETRIC) else 0
    if mode == TRUNCATE_TO_ZERO:
        truncate = (one << s) - 1
        bound = _magnitude(truncate)
    elif mode in (NATURAL, DOUBLE_SYMMETRIC, DOUBLE_ASYMMETRIC, SYMMETRIC):
        bound = _magnitude(half) + _magnitude(np.asarray(d)) + (mode == SYMMETRIC)
    elif mode == TRUNCATE_TO_LOWER:
        bound = 0
    else:
        return None  # `_rounding` names the mode
    if _magnitude(v) * _magnitude(m) + bound >= 1 << 63:
        return None
    prod = v * m
    shape = np.broadcast_shapes(prod.shape, s.shape)
    if shape != prod.shape:
        prod = np.broadcast_to(prod, shape).copy()
    if mode == TRUNCATE_TO_ZERO:
        prod += np.where(v >= 0, 0, truncate)
    elif mode != TRUNCATE_TO_LOWER:
        prod += half
    if mode == DOUBLE_SYMMETRIC and np.any(d):
        prod += np.where(v >= 0, d, -d)
    elif mode == DOUBLE_ASYMMETRIC:
        prod += d
    elif mode == SYMMETRIC:
        prod -= (v < 0) & (s > 0)
    prod >>= s
    return prod


def _magnitude(a: np.ndarray) -> int:
    """The greatest |element| (0 for an empty array), from the extremes (no array of absolute values)."""
    if not a.size:
        return 0
    return max(int(a.max()), -int(a.min()))


def saturate(values: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    if bits >= 64:
        return values
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return np.clip(values, lo, hi)
