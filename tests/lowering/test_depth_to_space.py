"""DepthToSpace (DCR) on U85 as one channel SLICE per output row phase stacked by a CONCAT, no TRANSPOSE
(LoweringOptions.depth_to_space_rows): the same integers as the TRANSPOSE form, checked against onnxruntime,
the portable lowering, Vela's cycles and npu-sim. A 1x1 conv to 32 channels on 16x16, depth-to-space 2 to
8x32x32: U85-256 0.0756 -> 0.0452 ms (U55 and U65 keep the TRANSPOSE, faster there)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from npbtest.lowering import assert_same_reference, model_of, ops
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import calib, check_int, io_dict, quantize_model, vela_run
from onnx import helper

from npubuild.ethosu.measured import CHOICES, D2S_SWAPS
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS


def sub_pixel(mode: str = "DCR") -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 4, 1, 1)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((3, 8, 1, 1)).astype(np.float32) * 0.3
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("DepthToSpace", ["r"], ["d"], blocksize=2, mode=mode),
             helper.make_node("Conv", ["d", "w2"], ["y"])]
    return model_of(nodes, {"x": [1, 4, 16, 16]}, {"y": [1, 3, 32, 32]}, {"w": w, "w2": w2})


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).uniform(-1, 1, (1, 4, 16, 16)).astype(np.float32)}


def test_u85_rows_same_integers_no_transpose_and_faster():
    model, cal = sub_pixel(), calib("x", [1, 4, 16, 16])
    rows, worst = check_int(model, cal, _feeds(), options=FAMILY_OPTIONS["u85"])
    assert worst <= 1 and "TRANSPOSE" not in ops(rows) and "CONCAT" in ops(rows)
    qdq = quantize_model(model, cal)
    # against one TRANSPOSE, as Vela chains it itself
    shuffled = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u85"], depth_to_space_rows=False,
                                                       transpose_block_swaps=False))
    assert "TRANSPOSE" in ops(shuffled)
    assert_same_reference(shuffled, rows)
    assert vela_run(rows.tosa, "ethos-u85-256").cycles < vela_run(shuffled.tosa, "ethos-u85-256").cycles
    # as block swaps the TRANSPOSE form is the faster here: U85 measures the two per model (measured.D2S_SWAPS)
    swaps = lower_model(qdq, "int", options=replace(FAMILY_OPTIONS["u85"], depth_to_space_rows=False))
    assert_same_reference(swaps, rows)
    assert vela_run(swaps.tosa, "ethos-u85-256").cycles < vela_run(rows.tosa, "ethos-u85-256").cycles
    assert D2S_SWAPS in CHOICES["u85"] and D2S_SWAPS.applies(model, FAMILY_OPTIONS["u85"])
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(rows.tosa, io_dict(rows), vela_raw(rows.tosa, Path(tmp), "ethos-u85-256"))


def test_u55_and_u65_keep_the_transpose():
    for family in ("u55", "u65"):
        lowered, worst = check_int(sub_pixel(), calib("x", [1, 4, 16, 16]), _feeds(), options=FAMILY_OPTIONS[family])
        assert worst <= 1 and "TRANSPOSE" in ops(lowered), family


def test_torch_pixel_shuffle_after_its_conv_takes_the_rows_too():
    """torch exports pixel_shuffle as CRD; the import reorders the conv's channels to DCR (exporter_idioms)."""
    lowered, worst = check_int(sub_pixel("CRD"), calib("x", [1, 4, 16, 16]), _feeds(), options=FAMILY_OPTIONS["u85"])
    assert worst <= 1 and "TRANSPOSE" not in ops(lowered) and "CONCAT" in ops(lowered)
