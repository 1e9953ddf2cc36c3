"""npu-sim on a graph split around a host operator: every NPU partition's artifact is verified on its own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from npbtest import read_report, run_subprocess
from onnx import TensorProto, helper, numpy_helper

SPEC = """version: 1
name: p
models:
  m:
    path: models/m.onnx
    calibration: {random: {samples: 8, seed: 0}}
targets:
  - {extends: ethos-u55-128, name: u55-raw, vela: {output_format: raw}}
verify: {tosa: true, samples: 2}
"""


def _split_model() -> onnx.ModelProto:
    """Conv -> Greater/Where (SELECT is not a U55 operator: a host partition) -> Conv."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, .3, (8, 4, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, .3, (8, 8, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(0.1, np.float32), "t"),
             numpy_helper.from_array(np.array(-0.5, np.float32), "neg")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Greater", ["c1", "t"], ["g"], name="gt"),
             helper.make_node("Where", ["g", "c1", "neg"], ["wh"], name="where"),
             helper.make_node("Conv", ["wh", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_each_npu_partition_is_bitexact(tmp_path: Path):
    root = tmp_path / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    onnx.save(_split_model(), root / "configs" / "models" / "m.onnx")
    (root / "configs" / "p.yaml").write_text(SPEC)
    proc = run_subprocess(["build", "configs", "--build-dir", "build"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build = read_report(root / "build")["builds"][0]
    assert build["stages"]["npu-sim"]["status"] == "passed" and build["metrics"]["npusim_bitexact"] is True
    result = json.loads(next((root / "build" / "stages" / "npu-sim").glob("*/npusim.json")).read_text())
    assert result["partitions"] == 2 and result["bitexact"] is True
    assert sorted(k.split("/")[0] for k in result["mismatches"]) == ["u55_part0", "u55_part2"]
    assert all(m["elements"] == 0 and m["of"] == 2 * 8 * 8 * 8 for m in result["mismatches"].values())


def test_u85_runs_the_same_graph_whole_and_bitexact(tmp_path: Path):
    """U85 has SELECT and int32 comparisons: no host partition, and npu-sim checks the one artifact."""
    root = tmp_path / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    onnx.save(_split_model(), root / "configs" / "models" / "m.onnx")
    (root / "configs" / "p.yaml").write_text(SPEC.replace("{extends: ethos-u55-128, name: u55-raw",
                                                          "{extends: ethos-u85-256, name: u85-raw"))
    proc = run_subprocess(["build", "configs", "--build-dir", "build"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build = read_report(root / "build")["builds"][0]
    assert build["target"] == "u85-raw" and build["metrics"]["npusim_bitexact"] is True
    result = json.loads(next((root / "build" / "stages" / "npu-sim").glob("*/npusim.json")).read_text())
    assert result["partitions"] == 1 and result["bitexact"] is True and result["npu_ops"] >= 4
