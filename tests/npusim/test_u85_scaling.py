"""U85 output scaling: the vectorised int64 arithmetic (with its two-limb path for products past 64 bits) equals the
rounding modes' definitions computed on Python integers, and DOUBLE_SYMMETRIC with dbl_rnd 0 is TOSA's
DOUBLE_ROUND (the modes' meaning against hardware is what the bit-exact op tests check)."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.npusim.u85.scaling import (
    DOUBLE_ASYMMETRIC,
    DOUBLE_SYMMETRIC,
    NATURAL,
    ROUND_NAMES,
    SYMMETRIC,
    TRUNCATE_TO_LOWER,
    TRUNCATE_TO_ZERO,
    scale,
)


def reference(v: int, m: int, s: int, mode: int, dbl: int) -> int:
    """One value, exactly: the rounding term per mode, then floor((v * m + round) / 2^s)."""
    r = 1 << (s - 1) if s > 0 else 0
    d = 1 << (30 - dbl) if s > 31 - dbl else 0
    if mode == DOUBLE_SYMMETRIC:
        r += d if v >= 0 else -d
    elif mode == DOUBLE_ASYMMETRIC:
        r += d
    elif mode == SYMMETRIC and v < 0 and s > 0:
        r -= 1
    elif mode == TRUNCATE_TO_ZERO:
        r = 0 if v >= 0 else (1 << s) - 1
    elif mode == TRUNCATE_TO_LOWER:
        r = 0
    return (v * m + r) >> s


@pytest.mark.parametrize("mode", range(6), ids=ROUND_NAMES)
@pytest.mark.parametrize("bits", [32, 48])
def test_vectorised_scaling_is_exact(mode, bits):
    rng = np.random.default_rng(mode + bits)
    v = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), 4000)
    m = rng.integers(1, 1 << 31, 4000)
    s = rng.integers(0, 64, 4000)
    v[:8] = [0, -1, 1, 5, -5, 6, -6, 7]  # halfway and small cases
    s[:8] = 1
    for dbl in (0, 3):
        got = scale(v, m, s, mode, dbl)
        want = [reference(int(a), int(b), int(c), mode, dbl) for a, b, c in zip(v, m, s, strict=True)]
        lim = 1 << 62  # results past any OFM width may be clamped; all others are exact
        ok = [abs(w) < lim for w in want]
        np.testing.assert_array_equal(got[ok], np.array(want, dtype=object)[ok].astype(np.int64))


def test_double_symmetric_is_tosa_double_round():
    v = np.array([5, -5, 1 << 20, -(1 << 20), 123456789, -123456789])
    m, s = 1 << 30, 33  # shift > 31: TOSA adds +-2^30 before the shift
    tosa = [(int(x) * m + (1 << 32) + ((1 << 30) if x >= 0 else -(1 << 30))) >> s for x in v]
    assert list(scale(v, m, s, DOUBLE_SYMMETRIC)) == tosa
    assert list(scale(v, m, s, NATURAL)) == [(int(x) * m + (1 << 32)) >> s for x in v]


@pytest.mark.parametrize("mode", range(6), ids=ROUND_NAMES)
def test_per_channel_scaling_over_samples_is_exact(mode):
    """The shapes the output stage gives it: accumulators (samples, h, w, c), a multiplier and shift per channel
    (the rounding term added in place, part by part), and one global multiplier and shift."""
    rng = np.random.default_rng(100 + mode)
    v = rng.integers(-(1 << 31), 1 << 31, (3, 4, 5, 6))
    v[0, 0, 0, :3] = [0, -1, 1]
    m = rng.integers(1, 1 << 31, 6)
    s = rng.integers(0, 64, 6)
    s[:2] = [0, 32]
    for dbl in (0, 5):
        got = scale(v, m, s, mode, dbl)
        want = [reference(int(a), int(m[i % 6]), int(s[i % 6]), mode, dbl) for i, a in enumerate(v.flat)]
        assert got.shape == v.shape and list(got.ravel()) == want
        got = scale(v, 1 << 30, 33, mode, dbl)
        assert list(got.ravel()) == [reference(int(a), 1 << 30, 33, mode, dbl) for a in v.flat]
