"""`npubuild offloads`: one line per ONNX node with its placement and TOSA ops (and the rule, for a CPU node)."""

from __future__ import annotations

from pathlib import Path

import onnx
from npbtest import run_cli
from npbtest.builds import add_compare_model


def test_offloads_on_the_example_model_lists_every_node(project: Path, capsys):
    spec = project / "configs" / "kws.yaml"
    code, out, err = run_cli(["offloads", str(spec), "--target", "ethos-u55-128", "--build-dir",
                              str(project / "build")], capsys)
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    qdq = onnx.load(str(next((project / "build" / "stages" / "quantize").glob("*/model_qdq.onnx"))))
    compute = [n for n in qdq.graph.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")]
    assert len(lines) == len(compute)
    for line, node in zip(lines, compute, strict=True):
        assert line.startswith(f"{node.name}  {node.op_type}  -> NPU partition 0  [")
    assert "CONV2D" in lines[0]
    assert out.strip().splitlines()[-1] == "# 1 NPU partition(s), 0 node(s) on the CPU"


def test_offloads_names_the_rule_for_cpu_nodes(project: Path, capsys):
    add_compare_model(project)
    model = project / "configs" / "models" / "cmp.onnx"
    code, out, err = run_cli(["offloads", str(model), "--target", "ethos-u55-128", "--build-dir",
                              str(project / "build")], capsys, cwd=project)
    assert code == 0, err
    lines = {ln.split()[0]: ln for ln in out.splitlines() if not ln.startswith("#")}
    assert set(lines) == {"conv_a", "gt", "relu", "sel", "conv_b"}
    assert "-> NPU partition 0  [CONV2D, RESCALE]" in lines["conv_a"]
    assert "-> CPU (host partition 1)" in lines["gt"] and "rule u55-op-type" in lines["gt"] and "GREATER" in lines["gt"]
    assert "-> CPU (host partition 1)" in lines["sel"] and "SELECT" in lines["sel"]
    assert "-> NPU partition 2" in lines["conv_b"]

    code, out, err = run_cli(["offloads", str(model), "--target", "ethos-u85-256", "--build-dir",
                              str(project / "build")], capsys, cwd=project)
    assert code == 0, err
    assert "-> CPU" not in out and out.count("-> NPU partition 0") == 5


def test_offloads_unknown_target_in_spec_is_one_line_exit_2(project: Path, capsys):
    code, _, err = run_cli(["offloads", str(project / "configs" / "kws.yaml"), "--target", "ethos-u55-32"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "ethos-u55-32" in err


def test_offloads_of_a_node_with_no_lowering_names_it_on_the_host(project: Path, capsys):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    model = helper.make_model(helper.make_graph([helper.make_node("Cos", ["x"], ["y"], name="my_cos")], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = project / "cos.onnx"
    onnx.save(model, path)
    code, out, err = run_cli(["offloads", str(path), "--target", "ethos-u55-128", "--build-dir",
                              str(project / "build")], capsys, cwd=project)
    assert code == 0, err
    assert out.splitlines()[0] == ("my_cos  Cos  -> CPU (host partition 0)  [-]  rule no-lowering: "
                                   "no lowering to TOSA for this op type")
    assert out.strip().splitlines()[-1] == "# 0 NPU partition(s), 1 node(s) on the CPU"


def test_offloads_of_a_model_onnxruntime_cannot_run_is_one_line(project: Path, capsys):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    node = helper.make_node("Foo", ["x"], ["y"], name="my_foo", domain="com.example")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = project / "foo.onnx"
    onnx.save(model, path)
    code, _, err = run_cli(["offloads", str(path), "--target", "ethos-u55-128", "--build-dir",
                            str(project / "build")], capsys, cwd=project)
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "node 'my_foo' (com.example:Foo)" in lines[-1] and "Traceback" not in err
