"""U55 bilinear 2x in two channel halves written straight into the Concat (LoweringOptions.bilinear_channel_split).

The replicated intermediate of the U55 upsample is a U-Net's SRAM peak there; split into halves, each
half's intermediate is live alone and each half is its own Concat input (channel_parts.py). Checked on a
U-Net step: the same integers as the one-piece form (TOSA reference model, and npu-sim on the compiled
artifact), within 1 LSB of onnxruntime, less SRAM in Vela for about the same cycles; an upsample read by
anything but the Concat stays in one piece.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.lowering import BIG_UNET, qdq_unet_step
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, io_dict, prepare, quantize_model, rand, run_onnx, vela_run
from onnx import TensorProto, helper, numpy_helper

from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, PORTABLE, LoweringOptions
from npubuild.tosa.graph import read_tosa
from npubuild.tosa.run import run_tosa

# on U55 every split shares the row pad between both halves (its body copied by a 1x1 depthwise)
LARGE = (64, 8, 16)  # replicated 68x68x16 (72 KiB), split
SMALL = (16, 8, 16)  # replicated 20x20x16 (6 KiB): kept whole (ops_resize.SPLIT_MIN_BYTES)


@pytest.fixture(scope="module", params=[BIG_UNET, LARGE], ids=["16x16x32", "32x32x16"])
def qdq(request) -> onnx.ModelProto:
    return qdq_unet_step(*request.param)


def feeds_for(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    return {"x": rand([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim], seed=seed)}


def max_error_lsb(model: onnx.ModelProto, options: LoweringOptions) -> tuple[LoweredGraph, float]:
    """Lower with `options`; the largest error of any output against onnxruntime on the QDQ model, in LSB."""
    g = lower_model(copy.deepcopy(model), "int", options=options)
    feeds = feeds_for(model, 3)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(model, path)
        ref = run_onnx(str(path), feeds)
    got = run_tosa(g.tosa, g, feeds)
    errors = [np.max(np.abs(s.quantize_reference(ref[s.onnx_name]) - got[s.onnx_name].astype(np.float64)))
              for s in g.outputs]
    return g, float(max(errors))


def lowered(model: onnx.ModelProto, split: bool) -> LoweredGraph:
    """The u55 lowering with or without the split, held (as the lower stage holds it) to the portable
    lowering's error + 1 LSB."""
    g, err = max_error_lsb(model, replace(FAMILY_OPTIONS["u55"], bilinear_channel_split=split))
    assert err <= max_error_lsb(model, PORTABLE)[1] + 1
    return g


def final_concat_inputs(tosa: bytes) -> list[str]:
    """Producer op of each input of the skip Concat (the last CONCAT)."""
    info = read_tosa(tosa)
    producer = {out: op.op for op in info.ops for out in op.outputs}
    cat = [op for op in info.ops if op.op == "CONCAT"][-1]
    return [producer[t] for t in cat.inputs]


def resizes(g: LoweredGraph) -> int:
    return sum(op.op == "RESIZE" for op in read_tosa(g.tosa).ops)


def test_halves_are_concat_inputs_with_the_same_integers(qdq) -> None:
    whole, halves = lowered(qdq, False), lowered(qdq, True)
    assert final_concat_inputs(whole.tosa) == ["RESCALE", "RESCALE"]
    assert final_concat_inputs(halves.tosa) == ["RESCALE"] * 3  # skip copy, then each half's blur
    assert (resizes(whole), resizes(halves)) == (1, 2)
    for seed in (11, 12):
        feeds = feeds_for(qdq, seed)
        np.testing.assert_array_equal(*(run_tosa(g.tosa, whole, feeds)["y"] for g in (whole, halves)))


def test_halves_lower_u55_sram(qdq) -> None:
    whole, halves = lowered(qdq, False), lowered(qdq, True)
    a, b = vela_run(halves.tosa, "ethos-u55-128").summary, vela_run(whole.tosa, "ethos-u55-128").summary
    assert float(a["sram_memory_used"]) < float(b["sram_memory_used"])
    assert float(a["cycles_total"]) <= 1.03 * float(b["cycles_total"])


def test_halves_bitexact_on_npu_sim(qdq) -> None:
    g = lowered(qdq, True)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(g.tosa, io_dict(g), vela_raw(g.tosa, Path(tmp)), seeds=(0,))


def test_upsample_read_elsewhere_stays_whole() -> None:
    g = lowered(qdq_unet_step(*BIG_UNET, extra_reader=True), True)  # both outputs within 1 LSB
    assert resizes(g) == 1


def test_small_upsample_stays_whole() -> None:
    """Split, the small one would cost more cycles than its SRAM saving is worth (SPLIT_MIN_BYTES)."""
    assert resizes(lowered(qdq_unet_step(*SMALL), True)) == 1


def test_concat_in_another_layout_takes_the_halves_joined() -> None:
    """A Concat whose other inputs come in NCHW (reshaped from 3-D) concatenates in that layout: the halves
    are joined by one CONCAT and transposed with it (channel_parts.materialize); results within 1 LSB."""
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             numpy_helper.from_array(np.array([1, 4, 32, 32], np.int64), "shape")]
    nodes = [
        helper.make_node("Resize", ["a", "", "scales"], ["up"], mode="linear", coordinate_transformation_mode="half_pixel"),
        helper.make_node("Reshape", ["b", "shape"], ["rb"]),
        helper.make_node("Reshape", ["c", "shape"], ["rc"]),
        helper.make_node("Concat", ["rb", "up", "rc"], ["y"], axis=1),
    ]
    shapes = {"a": [1, 32, 16, 16], "b": [1, 4, 1024], "c": [1, 4, 1024]}
    graph = helper.make_graph(nodes, "layouts", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v)
                                                 for k, v in shapes.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 40, 32, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    cal = {}
    for k, v in shapes.items():
        cal.update(calib(k, v, n=8))
    qdq = quantize_model(prepare(model), cal)
    g = lower_model(copy.deepcopy(qdq), "int", family="u55")
    ops = [op.op for op in read_tosa(g.tosa).ops]
    assert ops.count("RESIZE") == 2 and "TRANSPOSE" in ops
    feeds = {k: rand(v, seed=i) for i, (k, v) in enumerate(shapes.items())}
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(qdq, Path(tmp) / "m.onnx")
        ref = run_onnx(str(Path(tmp) / "m.onnx"), feeds)["y"]
    got = run_tosa(g.tosa, g, feeds)["y"].astype(np.float64)
    assert np.max(np.abs(g.outputs[0].quantize_reference(ref) - got)) <= 1
