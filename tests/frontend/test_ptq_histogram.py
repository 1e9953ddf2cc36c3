"""The PTQ statistics' histogram (ptq/histogram.py): np.histogram's counts exactly, values at the bin edges included."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.frontend.ptq import histogram
from npubuild.frontend.ptq.histogram import Histogram
from npubuild.frontend.ptq.stats import BINS


def _at_edges(lo: float, hi: float, ulps: int = 3) -> np.ndarray:
    """Every float32 bin edge numpy uses for [lo, hi] and its float32 neighbours up to `ulps` away, within the range:
    the values whose bin numpy corrects after its estimate."""
    edges = np.linspace(lo, hi, BINS + 1, dtype=np.float32)
    values = [edges]
    up, down = edges.copy(), edges.copy()
    for _ in range(ulps):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
        values += [up, down]
    v = np.concatenate(values)
    return v[(v >= np.float32(lo)) & (v <= np.float32(hi))]


def _numpy(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.histogram(v, bins=BINS, range=(lo, hi))[0]


def _counts(v: np.ndarray, lo: float, hi: float, finite: bool = True) -> np.ndarray:
    h = Histogram(lo, hi, BINS)
    h.add(v, finite)
    return h.total()


@pytest.mark.parametrize("lo, hi, corrected", [(0.0, 6.0, False), (-17.375998, 1.2974945, True),
                                               (-3.0e-3, 2.5e-3, True), (100.0, 164.0, False), (-0.5, 1.0e4, True),
                                               (1.0e-8, 3.0e-8, True)])
def test_values_at_and_beside_every_edge_count_as_numpy_counts_them(lo, hi, corrected):
    """Each float32 edge and its neighbours a few steps either side, which numpy's estimate puts on the wrong side
    of an edge now and then (`corrected`: it then moves them one by one): the same counts, with the quick count."""
    lo, hi = float(np.float32(lo)), float(np.float32(hi))
    v = _at_edges(lo, hi)
    assert histogram._delta(lo, hi, BINS) is not None
    estimate = np.minimum(((v - np.float32(lo)) / np.float64(hi - lo) * BINS).astype(np.intp), BINS - 1)
    assert np.array_equal(np.bincount(estimate, minlength=BINS), _numpy(v, lo, hi)) != corrected
    np.testing.assert_array_equal(_counts(v, lo, hi), _numpy(v, lo, hi))


@pytest.mark.parametrize("seed", range(4))
def test_activations_count_as_numpy_counts_them(seed):
    """Relu-like (half exactly 0), heavy-tailed and constant-heavy values over their own range, longer than one block."""
    rng = np.random.default_rng(seed)
    v = rng.standard_t(3.0, 200_003).astype(np.float32) * np.float32(rng.uniform(0.01, 50))
    v[rng.random(v.size) < 0.3] = np.float32(rng.choice(v))  # a value repeated (padding, a saturated unit)
    for values in (v, np.maximum(v, 0)):
        lo, hi = float(values.min()), float(values.max())
        np.testing.assert_array_equal(_counts(values, lo, hi), _numpy(values, lo, hi))


def test_a_sum_over_samples_is_numpys_sum_however_many_values_are_set_aside(monkeypatch):
    """Samples added one by one (the set-aside values counted at the end, or whenever more than MAX_ASIDE are held):
    the sum of np.histogram's counts per sample."""
    lo, hi = -17.375998, 1.2974945
    lo, hi = float(np.float32(lo)), float(np.float32(hi))
    rng = np.random.default_rng(7)
    samples = [np.concatenate([_at_edges(lo, hi), rng.uniform(lo, hi, 3000).astype(np.float32)]) for _ in range(5)]
    expect = sum(_numpy(s, lo, hi) for s in samples)
    for held in (1 << 20, 100):
        monkeypatch.setattr(histogram, "MAX_ASIDE", held)
        h = Histogram(lo, hi, BINS)
        for s in samples:
            h.add(s, True)
        np.testing.assert_array_equal(h.total(), expect)


def test_ranges_the_bound_does_not_cover_and_non_finite_values_are_numpys_own():
    """A range narrow beside its magnitude (numpy's edges a large part of a bin off), values that are not float32, and
    values with NaN and inf (which numpy leaves out): numpy counts them, so the counts are its own."""
    narrow = (1000.0, float(np.nextafter(np.float32(1000.0), np.float32(2000.0)) + np.float32(0.5)))
    assert histogram._delta(*narrow, BINS) is None
    assert histogram._delta(-3e38, 3e38, BINS) is None  # an offset from lo beyond float32
    v = _at_edges(*narrow)
    np.testing.assert_array_equal(_counts(v, *narrow), _numpy(v, *narrow))
    wide = np.random.default_rng(1).normal(size=5000)
    np.testing.assert_array_equal(_counts(wide, -1.0, 1.0), _numpy(wide, -1.0, 1.0))
    bad = np.random.default_rng(2).normal(size=5000).astype(np.float32)
    bad[:3] = [np.nan, np.inf, -np.inf]
    lo, hi = float(np.nanmin(bad[3:])), float(np.nanmax(bad[3:]))
    np.testing.assert_array_equal(_counts(bad, lo, hi, False), _numpy(bad, lo, hi))


def test_histograms_sharing_one_scratch_count_as_numpy_counts_them():
    """Two tensors' histograms filled in turn through one set of block buffers (as ptq/stats.py fills them, sample by
    sample), with arrays shorter than, as long as and longer than a block, and values at the edges: each histogram's
    counts are numpy's over its own values, so nothing one leaves in the buffers reaches the other."""
    rng = np.random.default_rng(11)
    scratch = histogram.Scratch()
    ranges = [(-17.375998, 1.2974945), (0.0, 6.0)]
    ranges = [(float(np.float32(lo)), float(np.float32(hi))) for lo, hi in ranges]
    hists = [Histogram(lo, hi, BINS, scratch) for lo, hi in ranges]
    added: list[list[np.ndarray]] = [[], []]
    for size in (5, histogram.BLOCK, 3 * histogram.BLOCK + 17, 1000):
        for k, (lo, hi) in enumerate(ranges):
            v = np.concatenate([_at_edges(lo, hi), rng.uniform(lo, hi, size).astype(np.float32)])[:max(size, 5)]
            rng.shuffle(v)
            hists[k].add(v, True)
            added[k].append(v)
    for k, (lo, hi) in enumerate(ranges):
        assert hists[k].scratch is scratch
        np.testing.assert_array_equal(hists[k].total(), sum(_numpy(v, lo, hi) for v in added[k]))
