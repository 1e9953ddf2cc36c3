"""Per-layer performance: Vela's per-layer figures in report.json, each traced back to its ONNX node."""

from __future__ import annotations

from pathlib import Path

import onnx
from npbtest import read_report, run_cli
from npbtest.builds import add_compare_model


def _compute_nodes(build_dir: Path) -> list[onnx.NodeProto]:
    qdq = onnx.load(str(next((build_dir / "stages" / "quantize").glob("*/model_qdq.onnx"))))
    return [n for n in qdq.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]


def test_every_layer_is_charged_to_an_onnx_node_and_the_costliest_are_in_report_md(project: Path, capsys):
    build_dir = project / "build"
    code, _, err = run_cli(["build", "--build-dir", str(build_dir), "-q", "--only", "ethos-u55-128"], capsys,
                           cwd=project)
    assert code == 0, err
    m = read_report(build_dir)["builds"][0]["metrics"]
    layers = m["layers"]
    names = {n.name for n in _compute_nodes(build_dir)}
    assert layers and all(lay["onnx_node"] in names for lay in layers)
    assert sum(lay["macs"] for lay in layers) == m["macs"]  # Vela's per-layer MACs add up to its total
    assert abs(sum(lay["cycles_pct"] for lay in layers) - 100.0) < 0.1
    assert all(lay["cycles"] > 0 and lay["target"] == "NPU" for lay in layers)
    assert {"sram_access_cycles", "off_flash_access_cycles", "mac_util_pct", "tosa_op"} <= set(layers[0])
    top = m["top_layers"]
    assert top[0]["cycles"] == max(lay["cycles"] for lay in layers)
    md = (build_dir / "report.md").read_text()
    assert f"| {top[0]['onnx_node']} | {top[0]['npu_op']} | 0 | {top[0]['cycles']} |" in md


def test_layers_of_every_npu_partition_are_reported(project: Path, capsys):
    spec = add_compare_model(project, targets="[ethos-u55-128]")
    build_dir = project / "build"
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(build_dir), "-q"], capsys)
    assert code == 0, err
    m = read_report(build_dir)["builds"][0]["metrics"]
    by_part = {}
    for lay in m["layers"]:
        by_part.setdefault(lay["partition"], set()).add(lay["onnx_node"])
    assert by_part == {0: {"conv_a", "relu"}, 2: {"conv_b"}}
    assert sum(lay["macs"] for lay in m["layers"]) == m["macs"]
