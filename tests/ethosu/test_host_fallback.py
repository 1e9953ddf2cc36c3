"""Host fallback: a node no lowering takes runs on the host (onnxruntime), the rest on the NPU, and the
partitioned model is checked end to end; a node even onnxruntime cannot run is one line, exit 2."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
from npbtest import REPO, read_report, run_cli
from npbtest.builds import custom_op_model, write_spec
from onnx import TensorProto, helper, numpy_helper

from npubuild.lowering.fallback import LOWERING_REFUSED, NO_LOWERING, cut_model, lower_lowerable
from npubuild.models.zoo import alexnet_lrn


def _example(project: Path, targets: str | None = None, expect: str | None = None) -> Path:
    shutil.copy(REPO / "configs" / "host_fallback.yaml", project / "configs" / "host_fallback.yaml")
    onnx.save(alexnet_lrn(), project / "configs" / "models" / "alexnet_lrn.onnx")
    spec = project / "configs" / "host_fallback.yaml"
    text = spec.read_text()
    if targets:
        text = text.replace("targets: [ethos-u55-128, ethos-u85-256]", f"targets: {targets}")
    if expect:
        text = text[:text.index("expect:")] + f"expect: {expect}\n"
    spec.write_text(text)
    return spec


def test_the_example_builds_with_the_int8_lrn_on_the_host_and_checks_the_split(project: Path, capsys):
    spec = _example(project)
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 0, err
    for b in read_report(project / "build")["builds"]:
        m = b["metrics"]
        assert b["status"] == "passed" and all(g["ok"] for g in b["gates"])
        (host,) = [p for p in m["offloads"] if p["kind"] == "cpu"]
        assert (host["op_type"], host["rule"]) == ("LRN", LOWERING_REFUSED) and "FP profile only" in host["reason"]
        assert [p["kind"] for p in m["partition_graph"]] == ["npu", "host", "npu"]
        assert m["deployed_max_error_lsb"] <= 1 and m["tosa_snr_db"] > 30
        assert "tosa" not in b["artifacts"]
    # the result line labels each NPU partition's pools (they were listed twice, unlabelled)
    code, out, _ = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "--progress", "plain", "-v"],
                           capsys)
    ok = [ln for ln in out.splitlines() if ln.startswith("ok ")]
    assert code == 0 and len(ok) == 2
    assert all(re.search(r"NPU part 0: sram [\d.]+/\d+ KiB \(\d+%\), .*; NPU part 2: sram ", ln) for ln in ok), ok
    lower_dir = next((project / "build" / "stages" / "lower").glob("alexnet_lrn-*/io.json")).parent
    assert not (lower_dir / "model.tosa").exists()  # no single TOSA graph: the portable split stands for it
    io = json.loads((lower_dir / "io.json").read_text())
    assert [(p["kind"], p["file"]) for p in io["portable"]["partitions"]] == [
        ("npu", "part0.tosa"), ("host", "host1.onnx"), ("npu", "part2.tosa")]
    numerics = json.loads(next((project / "build" / "stages" / "tosa-check").glob("*/numerics.json")).read_text())
    assert numerics["checked"] == "partitioned" and numerics["tosa_max_error_lsb"] <= 1
    assert set(numerics["partitioned"]) == {"u55", "u85"}  # the families of the spec's targets, no other

    code, out, err = run_cli(["offloads", str(spec), "--target", "ethos-u55-128", "--build-dir",
                              str(project / "build")], capsys)
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if " LRN " in ln]
    assert "-> CPU (host partition 1)  [-]  rule lowering-unsupported: LRN is lowered in the FP profile only" in line


def test_npu_offload_1_still_demands_everything_on_the_npu(project: Path, capsys):
    spec = _example(project, targets="[ethos-u85-256]", expect="{npu_offload: 1.0}")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 1
    (gate,) = [g for g in read_report(project / "build")["builds"][0]["gates"] if not g.get("default")]
    assert gate["name"] == "npu_offload" and not gate["ok"] and gate["value"] < 1.0
    assert "gate npu_offload failed" in err


def test_a_custom_op_onnxruntime_cannot_run_is_one_line_exit_2(project: Path, capsys):
    onnx.save(custom_op_model("com.example", "Foo"), project / "configs" / "models" / "foo.onnx")
    spec = write_spec(project, "foo", "foo.onnx", [1, 4, 4, 4], "[ethos-u55-128]")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 2
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err
    assert "node 'my_foo' (com.example:Foo)" in lines[0] and "onnxruntime has no kernel" in lines[0]


def test_a_standard_op_onnxruntime_rejects_is_one_line_exit_2(project: Path, capsys):
    """GRU with layout=1: a kernel exists, but onnxruntime refuses batch-major recurrences. (Import unrolls a
    recurrence of static length, whatever its layout: unequal per-batch sequence lengths keep it a GRU.)"""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 1, 2])
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.uniform(-1, 1, (1, 6, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.uniform(-1, 1, (1, 6, 2)).astype(np.float32), "R"),
             numpy_helper.from_array(np.array([5, 3], np.int32), "lens")]
    node = helper.make_node("GRU", ["x", "W", "R", "", "lens"], ["y"], hidden_size=2, layout=1, name="kws_gru")
    m = helper.make_model(helper.make_graph([node], "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, project / "configs" / "models" / "gru.onnx")
    spec = write_spec(project, "gru", "gru.onnx", [2, 5, 3], "[ethos-u55-128]")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if "error:" in ln]
    assert "node 'kws_gru' (GRU): onnxruntime cannot run it" in line and "layout" in line


def test_fp_profile_checks_the_partitioned_model_against_the_float_model(project: Path, capsys):
    """A contrib op onnxruntime runs and no lowering takes (com.microsoft:Trilu) goes to the host, named by domain."""
    onnx.save(custom_op_model("com.microsoft", "Trilu"), project / "configs" / "models" / "trilu.onnx")
    spec = write_spec(project, "trilu", "trilu.onnx", [1, 4, 4, 4], "[ethos-u55-128]", extra="pipeline: fp\n")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 0, err
    m = read_report(project / "build")["builds"][0]["metrics"]
    io = json.loads(next((project / "build" / "stages" / "lower").glob("m-*/io.json")).read_text())
    assert [(p["kind"], p["file"]) for p in io["portable"]["partitions"]] == [("npu", "part0.tosa"),
                                                                              ("host", "host1.onnx")]
    assert m["tosa_snr_db"] > 100  # float TOSA conv, onnxruntime's Trilu, against the float model


def _chain() -> onnx.ModelProto:
    """x -> Conv -> Cos (no lowering) -> Conv -> y, in float."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.uniform(-1, 1, (4, 4, 1, 1)).astype(np.float32), n) for n in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"), helper.make_node("Cos", ["a"], ["b"], name="cos"),
             helper.make_node("Conv", ["b", "w2"], ["y"], name="c2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def test_cut_model_turns_a_host_node_into_graph_outputs_and_inputs():
    cut = cut_model(_chain(), {"cos"})
    assert [n.name for n in cut.graph.node] == ["c1", "c2"]
    assert [i.name for i in cut.graph.input] == ["x", "b"] and [o.name for o in cut.graph.output] == ["y", "a"]
    partial = lower_lowerable(_chain(), "fp")
    assert set(partial.host) == {"cos"} and partial.host["cos"].rule == NO_LOWERING and not partial.whole
    assert set(partial.lowered.node_ops) == {"c1", "c2"}
