"""Output scaling: the hardware's fixed-point multiply-shift with its rounding modes.

TFL rounding gives TOSA's DOUBLE_ROUND for the shifts Vela emits, NATURAL
gives SINGLE_ROUND (round half up), TRUNCATE drops the fraction towards zero.
"""

from __future__ import annotations

import numpy as np

TFL, TRUNCATE, NATURAL = 0, 1, 2


def scale(value: np.ndarray, mult, shift, rounding: int) -> np.ndarray:
    """(value * mult) >> shift with the given rounding, in int64 (values are 32-bit accumulators)."""
    v = np.asarray(value, np.int64)
    m = np.asarray(mult, np.int64)
    s = np.asarray(shift, np.int64)
    prod = v * m
    if rounding == TRUNCATE:
        q = np.where(s > 0, np.abs(prod) >> np.maximum(s, 0), np.abs(prod))
        return np.where(prod < 0, -q, q)
    rnd = np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
    if rounding == TFL:
        rnd = rnd + np.where(s > 31, np.where(v >= 0, 1 << 30, -(1 << 30)), 0)
    return (prod + rnd) >> s


def saturate(values: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return np.clip(values, lo, hi)
