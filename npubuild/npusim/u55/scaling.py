"""Output scaling: the hardware's fixed-point multiply-shift with its rounding modes.

TFL rounding gives TOSA's DOUBLE_ROUND for the shifts Vela emits, NATURAL
gives SINGLE_ROUND (round half up), TRUNCATE drops the fraction towards zero.
"""

from __future__ import annotations

import numpy as np

from npubuild.npusim.npu_op import type_range

TFL, TRUNCATE, NATURAL = 0, 1, 2


def scale(value: np.ndarray, mult, shift, rounding: int) -> np.ndarray:
    """(value * mult) >> shift with the given rounding, in int64 (values are 32-bit accumulators). A new array:
    the caller may change it in place."""
    v = np.asarray(value, np.int64)
    if (type(mult) is int and type(shift) is int) or (np.ndim(mult) == 0 and np.ndim(shift) == 0):
        return _scale_by_one(v, int(mult), int(shift), rounding)
    m = np.asarray(mult, np.int64)
    s = np.asarray(shift, np.int64)
    prod = v * m
    if rounding == TRUNCATE:
        q = np.where(s > 0, np.abs(prod) >> np.maximum(s, 0), np.abs(prod))
        return np.where(prod < 0, -q, q)
    shape = np.broadcast_shapes(prod.shape, s.shape)
    if shape != prod.shape:  # a shift per element over a broadcast value (SHR by a per-sample IFM2)
        prod = np.broadcast_to(prod, shape).copy()
    # the rounding term per channel, then (TFL, where a channel shifts past 31) +-2^30 by the value's sign:
    # added in place (int64 addition wraps alike in any order, so the same integers as one sum)
    prod += np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
    if rounding == TFL and np.any(s > 31):
        double = np.where(s > 31, np.int64(1 << 30), np.int64(0))
        prod += np.where(v >= 0, double, -double)
    prod >>= s
    return prod


def _scale_by_one(v: np.ndarray, m: int, s: int, rounding: int) -> np.ndarray:
    """`scale` with one multiplier and shift for the whole block (a global OFM scale): the same integers,
    its rounding term a Python int rather than a grid of np.where (the per-op cost of thousands of small
    U55 pooling ops)."""
    prod = v * m
    if rounding == TRUNCATE:
        q = np.abs(prod) >> s if s > 0 else np.abs(prod)
        return np.where(prod < 0, -q, q)
    prod += 1 << (s - 1) if s > 0 else 0
    if rounding == TFL and s > 31:
        prod += np.where(v >= 0, np.int64(1 << 30), np.int64(-(1 << 30)))
    prod >>= s
    return prod


def clamp(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """np.clip's values (maximum, then minimum) without its Python wrapper, which checks the bounds against
    the array's type on every call: most of a small op's clamping time."""
    return np.minimum(np.maximum(values, lo), hi)


def saturate(values: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    lo, hi = type_range(bits, signed)
    return clamp(values, lo, hi)
