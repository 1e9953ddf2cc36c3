"""The arena and constants lower bounds from shapes: sound against Vela, and a model that cannot fit its only
target fails in the early-fit stage (right after import) with the pool check's line, before quantize,
tosa-check and Vela run."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from npbtest import read_report, run_cli
from onnx import TensorProto, helper, numpy_helper

from npubuild.ethosu.early_fit import lower_bounds


def _conv(cin: int, cout: int, size: int, relu: bool = False) -> onnx.ModelProto:
    w = np.zeros((cout, cin, 1, 1), np.float32)
    w[:, 0] = 0.01
    nodes = [helper.make_node("Conv", ["x", "w"], ["c" if relu else "y"], name="conv0")]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu0"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_bounds_never_exceed_what_vela_needs(tmp_path: Path, capsys):
    onnx.save(_conv(8, 4096, 4), tmp_path / "wide.onnx")
    bounds = lower_bounds(onnx.shape_inference.infer_shapes(_conv(8, 4096, 4)))
    assert bounds.arena_bytes == 8 * 16 + 4096 * 16 and bounds.constants_bytes == 10 * 4096
    for target in ("ethos-u55-128", "ethos-u85-256"):
        code, out, err = run_cli(["compile", str(tmp_path / "wide.onnx"), "--target", target, "--build-dir",
                                  str(tmp_path / "b"), "--json"], capsys)
        assert code == 0, err
        roles = {r: kib for p in json.loads(out)["metrics"]["pools"] for r, kib in p["roles"].items()}
        assert bounds.arena_bytes / 1024 <= roles["arena"] and bounds.constants_bytes / 1024 <= roles["constants"]


def _limits() -> None:  # today's code quantises and runs tosa-check first: keep a failing run small
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_a_model_too_big_for_its_only_target_fails_early_with_the_pool_line(project: Path):
    onnx.save(_conv(16, 16, 128, relu=True), project / "configs" / "models" / "big.onnx")
    (project / "configs" / "big.yaml").write_text(
        "version: 1\nname: big\nmodels:\n  big:\n    path: models/big.onnx\n"
        "targets: [{extends: ethos-u55-128, name: small, pools: {sram: {size_kib: 128}}}]\n")
    (project / "configs" / "kws.yaml").unlink()
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", "-q"], cwd=project, capture_output=True,
                          text=True, timeout=600, preexec_fn=_limits)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: big/big/small: early-fit: target 'small': pool 'sram' (sram) needs 256.0 KiB "
                               "(arena 256.0 KiB) but has 128.0 KiB"), lines[0]  # the build and stage named first
    stages = {p.name for p in (project / "build" / "stages").iterdir()}
    assert stages == {"import", "early-fit"}  # quantize, lower, tosa-check and Vela never ran
    (entry,) = read_report(project / "build")["builds"]
    assert entry["status"] == "failed" and entry["stages"]["early-fit"]["status"] == "failed"
    assert entry["stages"]["import"]["status"] == "passed"


def test_a_model_that_fits_one_of_its_targets_is_not_stopped_early(project: Path, capsys):
    onnx.save(_conv(16, 16, 128, relu=True), project / "configs" / "models" / "big.onnx")
    (project / "configs" / "big.yaml").write_text(
        "version: 1\nname: big\nmodels:\n  big:\n    path: models/big.onnx\n"
        "targets: [{extends: ethos-u55-128, name: small, pools: {sram: {size_kib: 128}}}, ethos-u55-128]\n")
    (project / "configs" / "kws.yaml").unlink()
    code, _, err = run_cli(["build", "-q", "--keep-going"], capsys, cwd=project)
    builds = {b["target"]: b["status"] for b in read_report(project / "build")["builds"]}
    assert code == 1 and builds == {"small": "failed", "ethos-u55-128": "passed"}, err
    assert "pool 'sram' (sram) needs 512.0 KiB" in err  # the one that cannot fit: Vela's exact figure
