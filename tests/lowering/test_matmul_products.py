"""A MatMul of two feature maps as every product and a sum (LoweringOptions.matmul_products, U65's per-node
measured form): the same int32 sums as TOSA MATMUL, on the reference model and npu-sim, and faster on U65."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from npbtest.lowering import assert_same_reference, model_of, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, io_dict, quantize_model, vela_run
from onnx import helper

from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PORTABLE


def attention_scores(heads: int = 4, tokens: int = 16, dim: int = 16):
    """softmax-less attention scores: q @ k^T for q, k [1, heads, tokens, dim] (k transposed by the model)."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["y"], name="scores")]
    shape = [1, heads, tokens, dim]
    model = model_of(nodes, {"q": shape, "k": shape}, {"y": [1, heads, tokens, tokens]}, {})
    return quantize_model(model, {**calib("q", shape, seed=1), **calib("k", shape, seed=2)})


def test_same_sums_as_matmul():
    qdq = attention_scores()
    matmul = lower_model(qdq, "int", options=PORTABLE)
    products = lower_model(qdq, "int", options=replace(PORTABLE, matmul_products=True))
    assert "MATMUL" in ops(matmul) and "MATMUL" not in ops(products)
    assert {"MUL", "REDUCE_SUM"} <= set(ops(products))
    assert_same_reference(matmul, products)
    named = lower_model(qdq, "int", options=replace(PORTABLE, matmul_products_nodes=frozenset({"scores"})))
    assert named.tosa == products.tosa


def test_faster_on_u65_and_bitexact_on_npusim():
    qdq = attention_scores()
    own = FAMILY_OPTIONS["u65"]
    matmul = lower_model(qdq, "int", options=own)
    products = lower_model(qdq, "int", options=replace(own, matmul_products=True))
    assert vela_run(products.tosa, "ethos-u65-256").cycles < vela_run(matmul.tosa, "ethos-u65-256").cycles
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(products.tosa, io_dict(products), vela_raw(products.tosa, Path(tmp), "ethos-u65-256"))


def test_too_many_products_keep_matmul():
    qdq = attention_scores(heads=2, tokens=256, dim=16)  # 2 x 256 x 256 x 16 products: 8 MiB of int32
    products = lower_model(qdq, "int", options=replace(PORTABLE, matmul_products=True))
    assert "MATMUL" in ops(products)
