"""The PTQ range search's errors in their plain form, what ptq/ranges.quant_mse's row blocks must equal bit for bit
(tests/frontend/test_ptq_ranges.py on made-up histograms, bench/ptq_exact_check.py on the real models')."""

from __future__ import annotations

import numpy as np

from npubuild.frontend.ptq import ranges
from npubuild.frontend.ptq.stats import TensorStats


def one_matrix(s: TensorStats, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """quant_mse as it was: every candidate's per-bin errors in one matrix, np.clip and two comparisons."""
    edges = s.edges()[:: len(s.hist) // ranges.MSE_BINS]
    hist = s.hist.reshape(ranges.MSE_BINS, -1).sum(axis=1)
    centres = (edges[:-1] + edges[1:]) / 2
    lo_, hi_ = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    step = np.maximum(hi_ - lo_, 1e-30) / ranges.LEVELS
    x = centres[None, :]
    clipped = np.clip(x, lo_[:, None], hi_[:, None])
    inside = (x >= lo_[:, None]) & (x <= hi_[:, None])
    err = np.where(inside, (step[:, None] ** 2) / 12.0, (x - clipped) ** 2)
    return (err * hist[None, :]).sum(axis=1)
