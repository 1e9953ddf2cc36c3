"""np.histogram's counts over a fixed range, for float32 values, in about half its time: the same counts exactly.

The PTQ statistics (ptq/stats.py) count every activation of every calibration sample into a 2048-bin histogram
over the tensor's range: np.histogram was most of the quantize stage's own CPU (issue 33). Per block of
values, numpy computes each value's bin from its offset in float64, then moves it by one bin where the value
lies the other side of a float32 bin edge (two gathers of the edges and their comparisons): about 14 ns a
value, the corrections half of it. Those corrections can change a bin only for a value within rounding
error of an edge.

So `Histogram.add` estimates each value's bin in float32 (offset times bins per unit) and sets aside the few
values whose estimate lies within `delta` bins of an inner bin edge, where `delta` is twice the sum of the
worst rounding errors: of this estimate, of numpy's own estimate (taken as float32 throughout, whatever
numpy's precision) and of numpy's float32 bin edges (`_bounds`). Any other value is, in exact arithmetic,
further than those errors from every edge: numpy's estimate is the same bin, on the right side of both its
edges, so numpy corrects nothing and counts it where this estimate does (a value at the range's ends is in the
first or last bin either way). The set-aside values are counted by np.histogram itself, and as np.histogram
counts each value on its own (the same arithmetic per value, blocks only bounding memory), the two counts sum
to np.histogram's over all of them (that call made once per tensor, in `total`, or per MAX_ASIDE values held).
Where the bound is not small (a range narrow beside its magnitude or too wide for a float32 offset, values not
float32) or a value is not finite, np.histogram counts everything. tests/frontend/test_ptq_histogram.py
compares with np.histogram on values at and about the edges.
"""

from __future__ import annotations

import numpy as np

BLOCK = 1 << 16  # values per step: the buffers (0.25 to 0.5 MiB) stay in cache; larger steps cost more per value
MAX_ASIDE = 1 << 20  # set-aside values held before np.histogram counts them (values at edges can be many)
MAX_DELTA = 0.01  # bins: beyond this the set-aside values would be many, and the bound means little
U32 = 2.0 ** -24  # float32's unit roundoff
MIN_RANGE = 1e-30  # narrower: float32 subnormals (errors no longer relative) or bins per unit beyond float32
MAX_RANGE = 1e38  # wider: a value's float32 offset from lo could overflow


class Scratch:
    """The per-block buffers of `Histogram._quick`, made once and shared by every histogram one thread fills in turn:
    made per call (per tensor, per sample) they were about 1 MiB of fresh memory each time, a tenth of the count's
    time on ppocrv4_det (issue 33)."""

    def __init__(self) -> None:
        self.estimate = np.empty(BLOCK, np.float32)
        self.distance = np.empty(BLOCK, np.float32)
        self.index = np.empty(BLOCK, np.intp)
        self.near = np.empty(BLOCK, bool)
        self.other = np.empty(BLOCK, bool)


class Histogram:
    """`bins` equal bins over [lo, hi], summed over the arrays `add`ed: `total()` is the sum of np.histogram(v, bins,
    (lo, hi))[0] over them. `scratch`: buffers shared with other histograms filled by the same thread (its own
    otherwise)."""

    def __init__(self, lo: float, hi: float, bins: int, scratch: Scratch | None = None):
        self.lo, self.hi, self.bins = lo, hi, bins
        self.delta = _delta(lo, hi, bins)
        self.counts = np.zeros(bins + 2, np.intp)  # bin n: hi's (folded into the last); n + 1: the set-aside
        self.aside: list[np.ndarray] = []  # values for np.histogram, counted in one call (`_count_aside`)
        self.aside_size = 0
        self.scratch = scratch

    def add(self, v: np.ndarray, finite: bool) -> None:
        """Count `v` (flat); `finite`: every value is finite and within [lo, hi] (the caller's min and max say so),
        which the quick count needs."""
        if not finite or self.delta is None or v.dtype != np.float32:
            self.counts[:self.bins] += np.histogram(v, bins=self.bins, range=(self.lo, self.hi))[0]
        else:
            self._quick(v, self.delta)
            if self.aside_size > MAX_ASIDE:
                self._count_aside()

    def total(self) -> np.ndarray:
        """The counts (intp) of every value added."""
        self._count_aside()
        n = self.bins
        counts = self.counts[:n].copy()
        counts[n - 1] += self.counts[n]  # hi itself (and a value rounded up to it): the last bin, closed
        return counts

    def _count_aside(self) -> None:
        if self.aside:
            self.counts[:self.bins] += np.histogram(np.concatenate(self.aside), bins=self.bins,
                                                    range=(self.lo, self.hi))[0]
        self.aside, self.aside_size = [], 0

    def _quick(self, v: np.ndarray, delta: float) -> None:
        n = self.bins
        lo = np.float32(self.lo)
        per_unit = np.float32(n / (self.hi - self.lo))
        if self.scratch is None:
            self.scratch = Scratch()
        s = self.scratch
        for start in range(0, v.size, BLOCK):
            a = v[start:start + BLOCK]
            size = a.size
            g, d, index, near, other = (s.estimate[:size], s.distance[:size], s.index[:size], s.near[:size],
                                        s.other[:size])
            np.subtract(a, lo, out=g)
            np.multiply(g, per_unit, out=g)  # >= 0: a >= lo
            np.rint(g, out=d)
            np.subtract(g, d, out=d)
            np.abs(d, out=d)
            np.less(d, delta, out=near)
            np.greater(g, delta, out=other)  # the first edge (lo) and the last (hi) are no bin's doubt
            near &= other
            np.less(g, n - delta, out=other)
            near &= other
            np.copyto(index, g, casting="unsafe")  # the floor: g >= 0
            at = np.flatnonzero(near)  # the set-aside values' places, in order (a[near] and index[near] alike)
            if at.size:
                self.aside.append(a[at])
                self.aside_size += at.size
                index[at] = n + 1
            self.counts += np.bincount(index, minlength=n + 2)


def _delta(lo: float, hi: float, n: int) -> float | None:
    """The set-aside margin (bins) for [lo, hi], or None where the quick count does not apply."""
    if not (np.isfinite(lo) and np.isfinite(hi) and MIN_RANGE <= hi - lo <= MAX_RANGE) \
            or float(np.float32(lo)) != lo or float(np.float32(hi)) != hi:
        return None
    delta = 2.0 * _bounds(lo, hi, n)
    return delta if delta < MAX_DELTA else None


def _bounds(lo: float, hi: float, n: int) -> float:
    """The sum of the worst errors, in bins, of this module's estimate, of numpy's, and of numpy's edges.

    With F = n (x - lo) / (hi - lo) the exact bin position of x: this estimate rounds three times in float32 (the
    offset, the bins per unit, their product), so is within 4 n u of F (u = 2^-24, a little over for the
    float64 steps); numpy's, computed in float32 or better, likewise; numpy's edges are float32 roundings of
    lo + j (hi - lo) / n (computed in float64, or float32), each within 4 u max(|lo|, |hi|) of it: in bins,
    4 u n max(|lo|, |hi|) / (hi - lo)."""
    magnitude = max(abs(lo), abs(hi)) / (hi - lo)
    return 4 * U32 * n + 4 * U32 * n + 4 * U32 * n * magnitude
