"""quant.multiplier_shift and QParams.same_as take one scale on Python floats: the same results as numpy's
vectorised form, bit for bit (a RESCALE's multiplier and shift are in every graph's bytes)."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.lowering.quant import QParams, UnrepresentableScale, multiplier_shift


def scales() -> np.ndarray:
    rng = np.random.default_rng(0)
    edges = [1.0, 0.5, 0.25, 2.0 ** -31, 2.0 ** -40, 2.0 ** -70, 1e-30, 1e-300, 5e-324, 0.999999999999,
             1 - 2.0 ** -40, 1 - 2.0 ** -20, 1.5, 3.0, 2.0 ** 20, 2.0 ** 28]
    halves = [(2 * k + 1) * 2.0 ** -32 for k in range(2 ** 30, 2 ** 30 + 8)]  # exactly half an LSB of the multiplier
    return np.concatenate([edges, halves, 10.0 ** rng.uniform(-12, 6, 4000), rng.uniform(0, 1, 1000)])


@pytest.mark.parametrize("bits", [32, 16])
def test_one_scale_as_vectorised(bits: int) -> None:
    for s in scales():
        pair = np.array([s, 0.5])  # two channels: the vectorised form
        try:
            want = multiplier_shift(pair, bits)
        except UnrepresentableScale as exc:
            with pytest.raises(UnrepresentableScale) as one:
                multiplier_shift(s, bits)
            assert str(one.value) == str(exc)
            continue
        mult, shift = multiplier_shift(s, bits)
        assert mult.dtype == want[0].dtype and shift.dtype == want[1].dtype and mult.shape == shift.shape == (1,)
        assert (int(mult[0]), int(shift[0])) == (int(want[0][0]), int(want[1][0])), s


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), 2.0 ** 40])
def test_one_unrepresentable_scale_raises_as_before(bad: float) -> None:
    with pytest.raises(UnrepresentableScale) as one:
        multiplier_shift(bad)
    with pytest.raises(UnrepresentableScale) as two:
        multiplier_shift(np.array([bad, 0.5]))
    assert str(one.value) == str(two.value)


def test_same_as_matches_allclose() -> None:
    rng = np.random.default_rng(1)
    zp = np.asarray(3, np.int64)
    for _ in range(3000):
        a = float(10.0 ** rng.uniform(-8, 2))
        b = a * (1 + float(rng.choice([0.0, 1e-7, 9.99e-7, 1e-6, 1.0001e-6, 2e-6, -1e-6, -1.0001e-6, 1e-3])))
        qa = QParams(np.asarray(a, np.float64), zp, np.dtype(np.int8))
        qb = QParams(np.asarray(b, np.float64), zp, np.dtype(np.int8))
        assert qa.same_as(qb) == bool(np.allclose(qa.scale, qb.scale, rtol=1e-6, atol=0)), (a, b)
    inf = QParams(np.asarray(np.inf), zp, np.dtype(np.int8))
    assert inf.same_as(inf)  # numpy's rule for infinities kept
    assert not QParams(np.asarray(1.0), zp, np.dtype(np.int8)).same_as(
        QParams(np.asarray(1.0), np.asarray(4, np.int64), np.dtype(np.int8)))
