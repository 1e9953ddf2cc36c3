"""verify/node_errors: each node cut out with its Q/DQ pairs and fed the QDQ model's own inputs, and the
tosa-check metrics and gate made from it (issue 21)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from buildhelpers import conv_chain_model, write_spec
from npbtest import read_report, run_cli
from ophelpers import calib, quantize_model

from npubuild.models.builder import GraphBuilder
from npubuild.verify.node_errors import node_errors

PASSES = ["eliminate_identity", "remove_unused", "topological_sort"]


def _upsample_model():
    """Conv -> half-pixel bilinear 2x Resize -> Conv, as the U-Net decoder has it."""
    g = GraphBuilder("up", seed=2)
    y = g.relu(g.conv(g.input("x", [1, 4, 8, 8]), 4, 8, (3, 3)))
    y = g.node("Resize", [y, "", g.const(np.array([1, 1, 2, 2], np.float32), "scales")], mode="linear",
               coordinate_transformation_mode="half_pixel")
    g.output(g.conv(y, 8, 4, (3, 3)), [1, 4, 16, 16])
    return g.model()


def test_every_node_is_measured_and_bilinear_ties_round_up():
    cal = calib("x", [1, 4, 8, 8], n=16)
    qdq = quantize_model(_upsample_model(), cal)
    res = node_errors(qdq, PASSES, calib("x", [1, 4, 8, 8], n=4, seed=5))
    assert res.unchecked == []
    by_op = {e.op_type: e for e in res.nodes}
    assert sorted(e.op_type for e in res.nodes) == ["Conv", "Conv", "Resize"]
    assert res.worst is not None and res.worst.max_error_lsb <= 1
    # TOSA rounds the bilinear sum's exact ties (k + 1/2) up, onnxruntime's float32 mostly to even: every
    # difference is +1, so the mean signed error equals the fraction of elements off
    up = by_op["Resize"]
    assert 0 < up.mismatched < 0.1 and up.max_error_lsb == 1
    assert np.isclose(up.bias_lsb, up.mismatched)


def test_tosa_check_reports_the_worst_node_and_gates_it(project: Path, capsys):
    import onnx

    onnx.save(conv_chain_model(size=16, channels=8), project / "configs" / "models" / "chain.onnx")
    spec = write_spec(project, "chain", "chain.onnx", [1, 4, 16, 16], "[ethos-u85-256]",
                      "{max_tosa_node_error_lsb: 1, max_tosa_error_lsb: 1}")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 0, err
    (b,) = read_report(project / "build")["builds"]
    m = b["metrics"]
    assert m["tosa_worst_node"]["node"] in {"conv0", "conv1", "conv2"} and m["tosa_worst_node"]["op_type"] == "Conv"
    assert m["tosa_node_max_error_lsb"] == m["tosa_worst_node"]["max_error_lsb"] <= 1
    assert m["tosa_worst_output"] == "y"
    gate = next(g for g in b["gates"] if g["name"] == "max_tosa_node_error_lsb")
    assert gate["ok"] and gate["value"] == m["tosa_node_max_error_lsb"]
    md = (project / "build" / "report.md").read_text()
    assert f"{m['tosa_worst_node']['node']} (Conv)" in md
