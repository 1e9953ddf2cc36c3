"""conv_accumulate in its narrow arithmetic (int32 depthwise sums, float32 products) gives the integers of int64.

The oracle is the plain int64 sum over kernel taps (every tap's window times its weights, added in int64:
exact), on seeded random convolutions: depthwise and not, strides, dilations, several samples, and values
chosen at each side of the bounds where the arithmetic widens (2^24 for float32, 2^31 for int32, 2^52).
"""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.npusim.npu_op import Kernel, conv_accumulate, taps


def _oracle(x: np.ndarray, w: np.ndarray, k: Kernel, oh: int, ow: int, oc: int, depthwise: bool) -> np.ndarray:
    acc = np.zeros((*x.shape[:-3], oh, ow, oc), np.int64)
    for ky, kx, win in taps(x, k, oh, ow):
        if depthwise:
            acc += win * w[:, ky, kx, 0]
        else:
            acc += np.einsum("...c,oc->...o", win, w[:, ky, kx, :].astype(np.int64))
    return acc


def _case(rng: np.random.Generator, depthwise: bool, x_max: int, w_max: int):
    kh, kw = (int(v) for v in rng.integers(1, 6, 2))
    sy, sx, dy, dx = (int(v) for v in rng.integers(1, 3, 4))
    oh, ow = (int(v) for v in rng.integers(1, 7, 2))
    ic = int(rng.integers(1, 40))
    oc = ic if depthwise else int(rng.integers(1, 24))
    h, w_ = (oh - 1) * sy + (kh - 1) * dy + 1 + int(rng.integers(0, 2)), (ow - 1) * sx + (kw - 1) * dx + 1
    x = rng.integers(-x_max, x_max + 1, (int(rng.integers(1, 4)), h, w_, ic))
    w = rng.integers(-w_max, w_max + 1, (oc, kh, kw, 1 if depthwise else ic))
    x.flat[0], w.flat[0] = -x_max, w_max  # the bound is met, not just approached
    k = Kernel(kh, kw, sy, sx, dy, dx, False, 0, 0, 0, 0)
    return x, w, k, oh, ow, oc


# (|x|, |w|): 8-bit data (float32 / int32), 16-bit data (float64 / int32 or int64), and past 2^52 (int64)
RANGES = [(255, 255), (32768, 255), (1 << 20, 1 << 15), (1 << 31, 1 << 30)]


@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("x_max,w_max", RANGES)
def test_narrow_arithmetic_gives_the_int64_sums(depthwise: bool, x_max: int, w_max: int) -> None:
    rng = np.random.default_rng(x_max % 1000 + depthwise)
    for _ in range(40):
        x, w, k, oh, ow, oc = _case(rng, depthwise, x_max, w_max)
        got = conv_accumulate(x, w, k, oh, ow, oc, depthwise)
        assert got.dtype == np.int64
        assert np.array_equal(got, _oracle(x, w, k, oh, ow, oc, depthwise))


def test_a_sum_float32_cannot_hold_is_not_made_in_float32() -> None:
    """A 1x1 convolution whose sum is 2^24 + 1 (float32 would round it to 2^24) from two terms of 2^23: the bound
    2^24 + 2 takes float64; a looser bound would take float32 and lose the 1."""
    k = Kernel(1, 1, 1, 1, 1, 1, False, 0, 0, 0, 0)
    x = np.array([[[[(1 << 23) + 1, 1 << 23]]]], np.int64)
    w = np.array([[[[1, 1]]]], np.int64)
    assert int(conv_accumulate(x, w, k, 1, 1, 1, False)[0, 0, 0, 0]) == (1 << 24) + 1


def test_a_depthwise_sum_int32_cannot_hold_is_not_made_in_int32() -> None:
    """Two taps of 2^16 x 2^14 sum to 2^31, one past int32: the bound takes int64."""
    k = Kernel(2, 1, 1, 1, 1, 1, False, 0, 0, 0, 0)
    x = np.full((1, 2, 1, 3), 1 << 16, np.int64)
    w = np.full((3, 2, 1, 1), 1 << 14, np.int64)
    assert np.all(conv_accumulate(x, w, k, 1, 1, 3, True) == 1 << 31)
