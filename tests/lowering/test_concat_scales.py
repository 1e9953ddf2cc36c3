"""Concat inputs sharing the Concat output's quantisation (npubuild.frontend.qdq_concat), and what it buys in Vela.

A small U-Net step (conv skip, max-pool, conv, bilinear 2x Resize, channel Concat) quantised by onnxruntime
gets one scale per Concat group from the post-pass; the QDQ model stays close to the float one, the int8
TOSA graph matches onnxruntime on the rewritten QDQ model, no int8->int8 requantisation is left in front
of the Concat, and Vela runs it in fewer cycles on U85 (native bilinear RESIZE) and on U55 (replication +
blur written straight into the Concat).
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.lowering import UNET_SHAPE, max_copies, models  # noqa: F401  (models: fixture)
from npbtest.ops import calib, quantize_model, rand, run_onnx, single_op_model, vela_run
from onnx import numpy_helper

from npubuild.frontend import concat_order
from npubuild.frontend.qdq_concat import union_params
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, ConcatCopy
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa

ROOT = Path(__file__).resolve().parents[2]


def qparams(model: onnx.ModelProto) -> dict[str, tuple[float, int]]:
    """Per QuantizeLinear/DequantizeLinear output: its (scale, zero point)."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.output[0]: (float(inits[n.input[1]]), int(inits[n.input[2]])) for n in model.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and inits[n.input[1]].size == 1}


def concat_params(model: onnx.ModelProto) -> list[tuple[float, int]]:
    """Parameters of the Concat's inputs (their DequantizeLinear) and of its output (its QuantizeLinear)."""
    qp = qparams(model)
    cat = next(n for n in model.graph.node if n.op_type == "Concat")
    q_out = next(n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == cat.output[0])
    return [qp[i] for i in cat.input] + [qp[q_out]]


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-30)))


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "m.onnx"
        onnx.save(model, p)
        return next(iter(run_onnx(str(p), feeds).values()))


def test_union_params_cover_every_range() -> None:
    assert union_params([(0.02, -128), (0.01, -128)], symmetric=False) == pytest.approx((0.02, -128))
    s, z = union_params([(0.01, 0), (0.02, -128)], symmetric=False)  # [-1.28, 1.27] and [0, 5.1]
    # covered up to the half step the integer zero point rounds away (as onnxruntime's own parameters)
    assert s * (-128 - z) <= -1.28 + s / 2 and s * (127 - z) >= 5.1 - s / 2
    assert union_params([(0.01, 0), (0.03, 0)], symmetric=True) == pytest.approx((0.03, 0))


def test_concat_inputs_take_the_union_of_the_group(models) -> None:  # noqa: F811
    _, qdq, shared = models
    before, after = concat_params(qdq), concat_params(shared)
    assert len(set(before)) > 1, "onnxruntime should calibrate the Concat on its own"
    assert len(set(after)) == 1
    assert after[0] == pytest.approx(union_params(before, symmetric=False))
    # the Resize keeps its input's parameters, so the conv producing `deep` now quantises to the union
    qp = qparams(shared)
    assert qp[next(k for k in qp if k.startswith("deep") and "QuantizeLinear" in k)] == pytest.approx(after[0])


def test_quantisation_error_stays_small(models) -> None:  # noqa: F811
    fp, qdq, shared = models
    feeds = {"x": rand(UNET_SHAPE, seed=7)}
    ref = run(fp, feeds)
    # the skip now takes the deep branch's 4x coarser scale (0.014 -> 0.055): 36.9 -> 34.5 dB here; the example
    # U-Nets, whose ranges are closer, lose 0.05 dB
    assert snr_db(ref, run(shared, feeds)) > max(30.0, snr_db(ref, run(qdq, feeds)) - 3.0)


def lowered_ok(model: onnx.ModelProto, family: str, **changes) -> LoweredGraph:
    """Lower for `family` (with `changes` to its options); the int8 TOSA graph must match onnxruntime on the
    same QDQ model within 1 LSB."""
    g = lower_model(copy.deepcopy(model), "int", options=replace(FAMILY_OPTIONS[family], **changes))
    feeds = {"x": rand(UNET_SHAPE, seed=3)}
    ref, got = run(model, feeds), run_tosa(g.tosa, g, feeds)
    spec = g.outputs[0]
    assert float(np.max(np.abs(spec.quantize_reference(ref) - got[spec.onnx_name].astype(np.float64)))) <= 1.0
    return g


def int8_requantised_concat_inputs(tosa: bytes) -> int:
    """How many CONCAT inputs come from an int8 -> int8 RESCALE (a standalone requantisation in Vela)."""
    info = read_tosa(tosa)
    producer = {out: op for op in info.ops for out in op.outputs}
    count = 0
    for op in info.ops:
        if op.op == "CONCAT":
            for t in op.inputs:
                p = producer.get(t)
                count += p is not None and p.op == "RESCALE" and info.tensors[p.inputs[0]].dtype == "INT8"
    return count


def test_u85_shared_scales_drop_the_requantisation(models) -> None:  # noqa: F811
    _, qdq, shared = models
    before, after = lowered_ok(qdq, "u85"), lowered_ok(shared, "u85")
    assert int8_requantised_concat_inputs(before.tosa) == 2
    assert int8_requantised_concat_inputs(after.tosa) == 0
    assert vela_run(after.tosa, "ethos-u85-256").cycles < vela_run(before.tosa, "ethos-u85-256").cycles


def test_u55_blur_writes_into_the_concat(models) -> None:  # noqa: F811
    _, qdq, shared = models
    before, after = lowered_ok(qdq, "u55"), lowered_ok(shared, "u55")
    info = read_tosa(after.tosa)
    producer = {out: op.op for op in info.ops for out in op.outputs}
    cat = next(op for op in info.ops if op.op == "CONCAT" and len(op.inputs) == 2)
    # the blur's RESCALE feeds the Concat with no SLICE between; the skip (also read by MaxPool) is copied
    # by a 1x1 depthwise, which U55 runs faster than Vela's MemoryCopy
    assert [producer[t] for t in cat.inputs] == ["RESCALE", "RESCALE"]
    assert vela_run(after.tosa, "ethos-u55-128").cycles < vela_run(before.tosa, "ethos-u55-128").cycles


def test_u55_copies_the_skip_first(models) -> None:  # noqa: F811
    _, _, shared = models
    reordered = concat_order.copied_inputs_first(shared)
    cat = next(n for n in reordered.graph.node if n.op_type == "Concat")
    assert cat.input[0].startswith("skip"), list(cat.input)  # the skip is also read by the MaxPool: copied
    feeds = {"x": rand(UNET_SHAPE, seed=5)}
    np.testing.assert_array_equal(run(reordered, feeds), run(shared, feeds))  # conv weights permuted to match
    first = lowered_ok(shared, "u55")
    last = lowered_ok(shared, "u55", concat_order=False)
    a, b = vela_run(first.tosa, "ethos-u55-128").summary, vela_run(last.tosa, "ethos-u55-128").summary
    assert float(a["sram_memory_used"]) < float(b["sram_memory_used"])
    assert float(a["cycles_total"]) <= 1.01 * float(b["cycles_total"])


def test_u55_edge_pad_body_copied_by_depthwise() -> None:
    """The bilinear 2x edge pad on U55: the body (also read by the edge slices) is copied into each pad CONCAT
    by a 1x1 depthwise, which U55 runs about twice as fast as Vela's MemoryCopy; bit-exact against onnxruntime."""
    shape = [1, 16, 16, 16]
    m = single_op_model("Resize", {"x": shape}, {"y": None}, {"roi": np.zeros(0, np.float32),
                        "scales": np.array([1, 1, 2, 2], np.float32)}, mode="linear")
    qdq = quantize_model(m, calib("x", shape, n=8))
    g = lower_model(copy.deepcopy(qdq), "int", family="u55")
    feeds = {"x": rand(shape, seed=2)}
    spec = g.outputs[0]
    assert np.max(np.abs(spec.quantize_reference(run(qdq, feeds)) - run_tosa(g.tosa, g, feeds)[spec.onnx_name])) <= 1
    info = read_tosa(g.tosa)
    producer = {out: op for op in info.ops for out in op.outputs}
    pads = [op for op in info.ops if op.op == "CONCAT" and len(op.inputs) == 3]
    assert len(pads) == 2
    for op in pads:
        body = producer.get(op.inputs[1])
        assert body is not None and body.op == "RESCALE" and producer[body.inputs[0]].op == "DEPTHWISE_CONV2D"


def offchip(summary: dict[str, str]) -> float:
    return float(summary["dram_memory_used"]) + float(summary["off_chip_flash_memory_used"])


def test_u85_copies_the_skip_with_a_maximum(models) -> None:  # noqa: F811
    """On U85 the skip Vela must copy into the Concat is a MAXIMUM of itself: the same integers, faster than
    Vela's own copy (a pooling pass there) and, unlike U55's depthwise copy, with no constant off-chip."""
    _, _, shared = models
    maxed = lowered_ok(shared, "u85")
    assert max_copies(maxed.tosa) == [0]  # the skip, copied first
    dw = lowered_ok(shared, "u85", concat_copy=ConcatCopy.DEPTHWISE)  # first, by a 1x1 depthwise of ones
    plain = lowered_ok(shared, "u85", concat_copy=ConcatCopy.VELA, concat_order=False)  # Vela's own copy, last
    assert max_copies(plain.tosa) == []
    a, b, c = (vela_run(g.tosa, "ethos-u85-256").summary for g in (maxed, plain, dw))
    assert float(a["cycles_total"]) < float(b["cycles_total"])
    assert float(a["sram_memory_used"]) <= float(b["sram_memory_used"])
    assert offchip(a) <= offchip(b)
    assert offchip(a) < offchip(c)  # the depthwise form's ones and per-channel scale/bias


def state_stack(hidden: int = 32) -> onnx.ModelProto:
    """An LSTM step's shape (Silero VAD's): h = tanh(.) read by a decoder and stacked, through an Unsqueeze, with a
    cell state c ~25x wider into the state output."""
    from npbtest.lowering import model_of

    rng = np.random.default_rng(2)
    nodes = [onnx.helper.make_node("Gemm", ["x", "wh"], ["pre"]), onnx.helper.make_node("Tanh", ["pre"], ["h"]),
             onnx.helper.make_node("Gemm", ["x", "wc"], ["c"]),
             onnx.helper.make_node("Gemm", ["h", "wy"], ["y"]),
             onnx.helper.make_node("Unsqueeze", ["h", "axis0"], ["hu"]),
             onnx.helper.make_node("Unsqueeze", ["c", "axis0"], ["cu"]),
             onnx.helper.make_node("Concat", ["hu", "cu"], ["state"], axis=0)]
    inits = {"wh": rng.normal(0, 0.5, (16, hidden)).astype(np.float32),
             "wc": rng.normal(0, 6.0, (16, hidden)).astype(np.float32),
             "wy": rng.normal(0, 0.3, (hidden, 4)).astype(np.float32), "axis0": np.array([0], np.int64)}
    return model_of(nodes, {"x": [1, 16]}, {"y": [1, 4], "state": [2, 1, hidden]}, inits)


def test_a_stacked_input_read_elsewhere_keeps_its_own_grid() -> None:
    """Sharing the Concat's scale must not coarsen what another reader sees: h (tanh, [-1, 1]) keeps its own grid
    for the decoder and only its stacked copy takes the state's ~25x wider one (Silero VAD's h lost 0.5 dB at its
    decoder's input when the union reached back through the Unsqueeze). The Concat's inputs and output still
    share one grid, and the integer graph matches onnxruntime within 1 LSB (the Unsqueeze requantises)."""
    from npubuild.frontend.qdq_concat import share_concat_scales

    fp = state_stack()
    qdq = quantize_model(fp, calib("x", [1, 16], n=32))
    shared = copy.deepcopy(qdq)
    share_concat_scales(shared)
    qp = qparams(shared)
    h_grid = qp[next(k for k in qp if k.startswith("h_") and "DequantizeLinear" in k)]
    assert h_grid == pytest.approx(qparams(qdq)[next(k for k in qp if k.startswith("h_") and "Dequantize" in k)])
    assert len(set(concat_params(shared))) == 1 and concat_params(shared)[0][0] > 10 * h_grid[0]
    feeds = [{"x": rand([1, 16], seed=s)} for s in range(16)]
    y = [np.concatenate([run_onnx_all(m, f)["y"] for f in feeds]) for m in (fp, qdq, shared)]
    assert snr_db(y[0], y[2]) > snr_db(y[0], y[1]) - 0.5
    g = lower_model(copy.deepcopy(shared), "int", options=FAMILY_OPTIONS["u55"])
    for f in feeds[:4]:
        ref, got = run_onnx_all(shared, f), run_tosa(g.tosa, g, f)
        for spec in g.outputs:
            err = np.abs(spec.quantize_reference(ref[spec.onnx_name]) - got[spec.onnx_name].astype(np.float64))
            assert float(err.max()) <= 1.0, spec.onnx_name


def run_onnx_all(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "m.onnx"
        onnx.save(model, p)
        return run_onnx(str(p), feeds)
