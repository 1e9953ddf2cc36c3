"""Control flow at import (frontend/passes/control_flow.py, if_select.py; cleanup.py's eliminate_identity).

The cases are the real models' (../shared/models/real), made small: torch's If on a static shape (Silero
VAD's 16 kHz export, twelve of them nested), a branch that returns an outer value through an Identity (Silero's
LSTM branches, openWakeWord's head: onnx-ir's identity elimination made onnxruntime refuse the model as
"invalid", or raised "already an output of a different graph"), a data-dependent If whose branches are cheap
(openWakeWord's second stage; Silero's sample-rate switch), one whose branches cannot share a select, and a
Loop of a constant trip count (TorchScript's `for i in range(3)`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import compile_builds, read_report, run_cli
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.normalise import normalise
from npubuild.tosa.run import OnnxSession

OPSET = [helper.make_opsetid("", 17)]


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _same(a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    want, got = OnnxSession(a.SerializeToString())(feeds), OnnxSession(b.SerializeToString())(feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7)


def shape_if_model() -> onnx.ModelProto:
    """y = relu(x @ w) if x.shape[1] == 16 else -(x @ w), as torch.onnx writes it, with a dynamic batch; inside
    the then branch a second If on the same shape (nested, as Silero's are), whose else branch returns an outer
    value through an Identity."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32), "w")
    consts = [numpy_helper.from_array(np.array(1, np.int64), "one"),
              numpy_helper.from_array(np.array(16, np.int64), "sixteen")]
    inner = helper.make_node(
        "If", ["again"], ["inner_out"], name="inner_if",
        then_branch=helper.make_graph([helper.make_node("Relu", ["h"], ["r"], name="relu")], "t2", [],
                                      [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)]),
        else_branch=helper.make_graph([helper.make_node("Identity", ["h"], ["keep"], name="keep")], "e2", [],
                                      [helper.make_tensor_value_info("keep", TensorProto.FLOAT, None)]))
    then_g = helper.make_graph([helper.make_node("Identity", ["cond"], ["again"], name="again"), inner], "t", [],
                               [helper.make_tensor_value_info("inner_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["h"], ["n"], name="neg")], "e", [],
                               [helper.make_tensor_value_info("n", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["width"], name="gather"),
             helper.make_node("Equal", ["width", "sixteen"], ["cond"], name="equal"),
             helper.make_node("If", ["cond"], ["y"], name="outer_if", then_branch=then_g, else_branch=else_g)]
    graph = helper.make_graph(nodes, "shape_if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], [w, *consts])
    return helper.make_model(graph, opset_imports=OPSET)


def test_an_if_on_a_static_shape_folds_to_the_branch_it_takes_nested_ones_too():
    """Before: the Ifs stayed, and the whole model went to the host as one If node."""
    model = shape_if_model()
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "m.onnx")
    assert "If" not in _ops(out) and _ops(out) == ["MatMul", "Relu"]
    x = np.random.default_rng(1).normal(size=(1, 16)).astype(np.float32)
    _same(model, out, {"x": x})


def gated_head_model(else_outer: bool = True) -> onnx.ModelProto:
    """openWakeWord's head, small: a first score; only when it is >= 0.5 a second stage (its own layer) gives the
    result, else the first score itself (its else branch an Identity of the outer value)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(size=(12, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(np.array([0.1], np.float32), "b1"),
             numpy_helper.from_array(rng.normal(size=(12, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([-0.2], np.float32), "b2"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    then_g = helper.make_graph([helper.make_node("Gemm", ["x", "w2", "b2"], ["g2"], name="stage2_fc"),
                                helper.make_node("Sigmoid", ["g2"], ["s2"], name="stage2_sigmoid")], "then", [],
                               [helper.make_tensor_value_info("s2", TensorProto.FLOAT, [1, 1])])
    else_nodes = [helper.make_node("Identity", ["s1"], ["first"], name="first")] if else_outer else \
        [helper.make_node("Mul", ["s1", "half"], ["first"], name="halve")]
    else_g = helper.make_graph(else_nodes, "else", [], [helper.make_tensor_value_info("first", TensorProto.FLOAT, [1, 1])])
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["g1"], name="stage1_fc"),
             helper.make_node("Sigmoid", ["g1"], ["s1"], name="stage1_sigmoid"),
             helper.make_node("GreaterOrEqual", ["s1", "half"], ["high"], name="ge"),
             helper.make_node("Reshape", ["high", "scalar"], ["cond"], name="squeeze"),
             helper.make_node("If", ["cond"], ["y"], name="gate", then_branch=then_g, else_branch=else_g)]
    inits.append(numpy_helper.from_array(np.zeros((0,), np.int64), "scalar"))
    graph = helper.make_graph(nodes, "gated", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], inits)
    return helper.make_model(graph, opset_imports=OPSET)


def _inputs_taking_both_branches(model: onnx.ModelProto) -> list[np.ndarray]:
    """Inputs whose first score falls on each side of 0.5."""
    run = OnnxSession(model.SerializeToString())
    rng = np.random.default_rng(4)
    found: dict[bool, np.ndarray] = {}
    w1 = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w1")).ravel()
    for _ in range(200):
        x = rng.normal(size=(1, 12)).astype(np.float32)
        found.setdefault(float((x @ w1)[0]) + 0.1 >= 0.0, x)
        if len(found) == 2:
            break
    assert len(found) == 2 and run({"x": found[True]})["y"].shape == (1, 1)
    return list(found.values())


def test_a_data_dependent_if_with_cheap_branches_runs_both_and_selects():
    """Before: eliminate_identity dropped the else branch's Identity, and onnxruntime refused the imported model
    ("Subgraph output ... is an outer scope value being returned directly"): exit 2, naming a Mul."""
    model = gated_head_model()
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "m.onnx")
    ops = _ops(out)
    assert "If" not in ops and ops.count("Where") == 1 and ops.count("Gemm") == 2
    for x in _inputs_taking_both_branches(model):
        _same(model, out, {"x": x})


def test_the_gated_head_builds_on_the_npu_with_only_the_comparison_and_select_on_the_u55(tmp_path: Path, capsys):
    path = tmp_path / "gated.onnx"
    onnx.save(gated_head_model(), path)
    u55, u85 = compile_builds(path, ["ethos-u55-128", "ethos-u85-256"], tmp_path / "b", capsys)
    assert u55["status"] == "passed" and u85["status"] == "passed"
    host = {o["op_type"] for o in u55["metrics"]["offloads"] if o["kind"] != "npu"}
    assert host <= {"GreaterOrEqual", "Where", "Reshape"}  # Vela has no GREATER_EQUAL or SELECT on U55
    # ... which the Cortex-M runs in TensorFlow Lite Micro: the deployable on the virtual device is the QDQ model's
    assert u55["metrics"]["cortex_m_deployable"] is True and u55["metrics"]["device_max_error_lsb"] <= 1
    assert {o["op_type"] for o in u85["metrics"]["offloads"] if o["kind"] != "npu"} == set()


def test_an_if_whose_branches_differ_in_shape_stays_and_runs_on_the_host(tmp_path: Path, capsys):
    """A data-dependent If that no select can express is one host node with the reason: never a refusal of a
    model onnxruntime runs."""
    model = gated_head_model(else_outer=False)
    else_g = next(a for a in model.graph.node[-1].attribute if a.name == "else_branch").g
    else_g.node[0].CopyFrom(helper.make_node("Concat", ["s1", "s1"], ["first"], axis=1, name="twice"))
    else_g.output[0].CopyFrom(helper.make_tensor_value_info("first", TensorProto.FLOAT, [1, 2]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "width"]))
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "m.onnx")
    assert "If" in _ops(out)
    (tmp_path / "pyproject.toml").write_text("")
    onnx.save(model, tmp_path / "shapes.onnx")
    spec = tmp_path / "shapes.yaml"
    spec.write_text("""version: 1
name: shapes
models:
  shapes: {path: shapes.onnx, calibration: {random: {samples: 8, seed: 0}}}
targets:
  - ethos-u85-256
  - {extends: ethos-u85-256, name: u85-linux, host: {kind: cortex-a, cpu: cortex-a55}}
""")
    code, out, err = run_cli(["build", str(spec), "--build-dir", str(tmp_path / "b"), "-q", "--keep-going"], capsys)
    builds = {b["target"]: b for b in read_report(tmp_path / "b")["builds"]}
    linux = builds["u85-linux"]  # a Cortex-A host runs the If in onnxruntime: the model builds
    assert linux["status"] != "failed", out + err
    placed = {o["node"]: o for o in linux["metrics"]["offloads"]}
    assert placed["gate"]["kind"] != "npu" and placed["stage1_fc"]["kind"] == "npu"
    m85 = builds["ethos-u85-256"]  # TFLite Micro has no translation of it: one line saying so, not a refusal
    assert code == 1 and m85["status"] == "failed" and m85["error_kinds"] == ["stage"]
    assert "not deployable on a Cortex-M (cortex-m85): node 'gate' (If)" in m85["stages"]["vela"]["error"]


def loop_model(trips: int = 3) -> onnx.ModelProto:
    """acc = x; for i in range(trips): acc = acc * 0.5 + i; scan out acc each step (TorchScript's Loop)."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
         helper.make_node("Mul", ["acc_in", "half"], ["scaled"], name="scale"),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT, name="cast"),
         helper.make_node("Add", ["scaled", "fi"], ["acc_out"], name="add"),
         helper.make_node("Identity", ["acc_out"], ["scan"], name="scan_copy")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [1, 4])])
    inits = [numpy_helper.from_array(np.array(trips, np.int64), "trips"),
             numpy_helper.from_array(np.array(True), "true"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("Loop", ["trips", "true", "x"], ["final", "steps"], body=body, name="loop")]
    graph = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("final", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("steps", TensorProto.FLOAT, [trips, 1, 4])], inits)
    return helper.make_model(graph, opset_imports=OPSET)


def test_a_loop_of_a_constant_trip_count_is_unrolled():
    model = loop_model()
    out = normalise(onnx.ModelProto.FromString(model.SerializeToString()), {}, "m.onnx")
    assert "Loop" not in _ops(out)
    _same(model, out, {"x": np.random.default_rng(5).normal(size=(1, 4)).astype(np.float32)})


@pytest.mark.parametrize("where", ["cond", "trips"])
def test_a_loop_the_data_decides_stays(where: str):
    model = loop_model()
    model.graph.input.append(helper.make_tensor_value_info("n", TensorProto.INT64 if where == "trips" else TensorProto.BOOL, []))
    model.graph.node[0].input[0 if where == "trips" else 1] = "n"
    out = normalise(model, {}, "m.onnx")
    assert "Loop" in _ops(out)
