"""The MSE range search's error per candidate (ptq/ranges.quant_mse): the same float64 numbers as the one-matrix form
it replaced, so the same candidate wins every near-tie."""

from __future__ import annotations

import numpy as np
import pytest
from npbtest.ptq_reference import one_matrix as _one_matrix

from npubuild.frontend.ptq import ranges
from npubuild.frontend.ptq.stats import BINS, TensorStats


def _stats(lo: float, hi: float, hist: np.ndarray) -> TensorStats:
    s = TensorStats(np.array([lo]), np.array([hi]))
    s.hist = hist
    return s


def _candidates(s: TensorStats, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` candidate ranges: shrunk ends, ends exactly on bin centres (a centre on the range's edge is inside),
    zero-width ends (0.0 and -0.0) and the whole range."""
    edges = s.edges()[:: BINS // ranges.MSE_BINS]
    centres = (edges[:-1] + edges[1:]) / 2
    lo = s.lo * rng.uniform(0.0, 1.0, count)
    hi = s.hi * rng.uniform(0.0, 1.0, count)
    on = rng.random(count) < 0.3
    lo[on] = np.minimum(rng.choice(centres, on.sum()), 0.0)
    on = rng.random(count) < 0.3
    hi[on] = np.maximum(rng.choice(centres, on.sum()), 0.0)
    lo[::7], hi[::11] = -0.0, 0.0
    lo[-1], hi[-1] = s.lo, s.hi
    return lo, hi


@pytest.mark.parametrize("count", [1, 2, 25, 63, 64, 65, 128, 627, 1000])
def test_every_candidates_error_is_the_one_matrix_forms(count):
    """Candidate counts below, at and past a block of rows, ranges on both sides of 0 and one-sided (a Relu's
    [0, hi]), histograms with empty bins and large counts: the errors equal bit for bit."""
    rng = np.random.default_rng(count)
    for lo, hi in [(-3.25, 7.5), (0.0, 6.0), (-1e-4, 2e-5), (-12000.0, -0.5), (0.25, 40.0)]:
        hist = rng.integers(0, 10 ** rng.integers(1, 7), BINS).astype(np.float64)
        hist[rng.random(BINS) < 0.4] = 0.0
        s = _stats(lo, hi, hist)
        los, his = _candidates(s, count, rng)
        np.testing.assert_array_equal(ranges.quant_mse(s, los, his), _one_matrix(s, los, his))


def test_the_chosen_range_is_the_one_matrix_forms_on_activation_like_histograms(monkeypatch):
    """mse() over heavy-tailed and Relu-like histograms, symmetric and not (its own candidates, the percentile's and
    mean min/max's among them): every candidate's error equal, so the same range chosen."""
    rng = np.random.default_rng(5)
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    blocked = ranges.quant_mse

    def one_matrix(s: TensorStats, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        seen.append((blocked(s, lo, hi), _one_matrix(s, lo, hi)))
        return seen[-1][1]

    for seed in range(20):
        v = rng.standard_t(2.0 + seed % 4, 50_000) * rng.uniform(0.01, 30)
        if seed % 2:
            v = np.maximum(v, 0.0)
        lo, hi = float(v.min()), float(v.max())
        s = _stats(lo, hi, np.histogram(v, BINS, (lo, hi))[0].astype(np.float64))
        for symmetric in (False, True):
            chosen = ranges.mse(s, symmetric)
            with monkeypatch.context() as m:
                m.setattr(ranges, "quant_mse", one_matrix)
                assert ranges.mse(s, symmetric) == chosen
    assert len(seen) == 40
    for new, old in seen:
        np.testing.assert_array_equal(new, old)
