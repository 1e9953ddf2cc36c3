"""U55/U65 output scaling and clamping, as rewritten to work in place, give the integers of exact arithmetic.

Oracles: `scale` against Python's unbounded integers (the rounding rules written out per element), and
`clamp_bounds` against two clamps one after the other, exhaustively over small ranges (empty ones included).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from npubuild.npusim.npu_op import clamp_bounds, clamp_in_place
from npubuild.npusim.u55.scaling import NATURAL, TFL, TRUNCATE, clamp, scale


def _exact(v: int, m: int, s: int, rounding: int) -> int:
    """One element: (v * m) >> s with the hardware's rounding, on Python integers."""
    prod = v * m
    if rounding == TRUNCATE:
        q = abs(prod) >> s
        return -q if prod < 0 else q
    rnd = 1 << (s - 1) if s > 0 else 0
    if rounding == TFL and s > 31:
        rnd += (1 << 30) if v >= 0 else -(1 << 30)
    return (prod + rnd) >> s


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """32-bit accumulators, with the extremes and zero among them."""
    v = rng.integers(-(1 << 31), 1 << 31, shape)
    v.flat[: min(v.size, 3)] = [-(1 << 31), 0, (1 << 31) - 1][: min(v.size, 3)]
    return v


@pytest.mark.parametrize("rounding", [TFL, TRUNCATE, NATURAL])
@pytest.mark.parametrize("seed", range(3))
def test_scale_is_exact_per_channel_and_global(rounding: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    v = _values(rng, (2, 3, 4, 8))
    mult = rng.integers(0, 1 << 31, 8)
    shift = rng.integers(0, 50, 8)
    shift[:2] = [0, 32]  # no shift, and past 31 (TFL's double rounding)
    before = v.copy()
    got = scale(v, mult, shift, rounding)
    assert np.array_equal(v, before)  # the input is left alone: the result is a new array
    want = np.array([_exact(int(x), int(mult[i % 8]), int(shift[i % 8]), rounding) for i, x in enumerate(v.flat)])
    assert np.array_equal(got.ravel(), want)
    for m, s in ((1 << 30, 35), (12345, 0), (1 << 31, 31)):
        got = scale(v, m, s, rounding)
        assert np.array_equal(got.ravel(), [_exact(int(x), m, s, rounding) for x in v.flat])


def test_a_shift_per_element_broadcasts_the_value() -> None:
    """SHR of a broadcast scalar IFM by a per-sample IFM2: the shifts carry the sample axis, the value not."""
    rng = np.random.default_rng(7)
    v = _values(rng, (3, 2, 5))
    shift = rng.integers(0, 32, (4, 3, 2, 5))
    got = scale(v, 1, shift, NATURAL)
    want = [_exact(int(x), 1, int(s), NATURAL) for x, s in zip(np.broadcast_to(v, shift.shape).flat, shift.flat,
                                                                   strict=True)]
    assert got.shape == shift.shape and np.array_equal(got.ravel(), want)


def test_one_clamp_is_the_activation_clamp_then_the_type_saturation() -> None:
    v = np.arange(-12, 13)
    for a, b, c, d in itertools.product(range(-5, 6, 2), range(-6, 7, 3), range(-4, 5, 2), range(-5, 6, 2)):
        if c > d:  # a type's range is never empty
            continue
        lo, hi = clamp_bounds((a, b), (c, d))
        assert np.array_equal(clamp_in_place(v.copy(), lo, hi), clamp(clamp(v, a, b), c, d)), (a, b, c, d)
