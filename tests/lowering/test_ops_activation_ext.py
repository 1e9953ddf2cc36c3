"""Activations lowered as one int8 TABLE of the node as onnxruntime evaluates it (Elu, Selu, Celu, Softplus,
Softsign, Mish, Swish, ThresholdedRelu, Shrink, Sign, Floor, Ceil, Round): bit-exact with the QDQ graph
over the whole calibrated range; FP compositions against onnxruntime; Vela runs the TABLE on U55 and U85."""

from __future__ import annotations

import numpy as np
import pytest
from npbtest.ops import calib, check_fp, check_int, rand, single_op_model, vela_op_counts

CASES = [
    ("Elu", {}, (-3, 3), 17), ("Elu", {"alpha": 0.5}, (-3, 3), 17), ("Selu", {}, (-3, 3), 17),
    ("Celu", {"alpha": 2.0}, (-3, 3), 17), ("Softplus", {}, (-5, 5), 17), ("Softsign", {}, (-5, 5), 17),
    ("Mish", {}, (-5, 5), 18), ("Swish", {"alpha": 1.5}, (-5, 5), 24),
    ("ThresholdedRelu", {"alpha": 0.5}, (-2, 2), 17), ("Shrink", {"bias": 0.2, "lambd": 0.6}, (-2, 2), 17),
    ("Sign", {}, (-2, 2), 17), ("Floor", {}, (-3, 3), 17), ("Ceil", {}, (-3, 3), 17), ("Round", {}, (-3, 3), 17),
]
SHAPE = [1, 4, 8, 8]


def sweep(low: float, high: float) -> np.ndarray:
    n = int(np.prod(SHAPE))
    return np.random.default_rng(0).permutation(np.linspace(low, high, n, dtype=np.float32)).reshape(SHAPE)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0] + "".join(f"-{k}{v}" for k, v in c[1].items()))
def test_activation_is_one_exact_table(case):
    op, attrs, (low, high), opset = case
    model = single_op_model(op, {"x": SHAPE}, {"y": None}, opset=opset, **attrs)
    x = rand(SHAPE, 1, low, high)
    if op == "Round":
        x = np.round(x * 2) / 2  # every value a tie: round half to even
    check_fp(model, {"x": x}, rtol=1e-5, atol=1e-5)
    lowered, _ = check_int(model, calib("x", SHAPE, low=low, high=high), {"x": sweep(low, high)}, max_lsb=0)
    assert [op for ops in lowered.node_ops.values() for op in ops] == ["TABLE"]
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        assert vela_op_counts(lowered.tosa, accel) == (1, 0), accel
