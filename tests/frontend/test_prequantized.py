"""Models quantised by another tool build as they are: QOperator graphs (QLinearConv, com.microsoft QGemm,
QLinearGlobalAveragePool...) are normalised to QDQ at import, QDQ graphs are not quantised again, and the
compiled TOSA graph matches onnxruntime running the user's original file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO, run_subprocess
from npbtest.ops import run_onnx
from onnxruntime import quantization as ortq

from npubuild.frontend.normalise import normalise
from npubuild.frontend.quantize import ArrayReader
from npubuild.records.lower import LowerRecord
from npubuild.tosa.run import run_tosa


def _quantize_elsewhere(tmp: Path, fmt: ortq.QuantFormat) -> Path:
    """What a user brings: the DS-CNN quantised by onnxruntime's own tooling, in the given format."""
    float_path = tmp / "float.onnx"
    onnx.save(normalise(onnx.load(REPO / "configs" / "models" / "ds_cnn.onnx"), {"input": [1, 1, 49, 10]}, "x"),
              float_path)
    arrays = {"input": np.random.default_rng(0).uniform(-1, 1, (16, 1, 1, 49, 10)).astype(np.float32)}
    out = tmp / f"ds_cnn_{fmt.name.lower()}.onnx"
    ortq.quantize_static(str(float_path), str(out), ArrayReader(arrays), quant_format=fmt, per_channel=True,
                         activation_type=ortq.QuantType.QInt8, weight_type=ortq.QuantType.QInt8)
    return out


@pytest.mark.parametrize("fmt", [ortq.QuantFormat.QOperator, ortq.QuantFormat.QDQ], ids=["qoperator", "qdq"])
def test_prequantized_model_compiles_and_matches_the_original(tmp_path: Path, fmt):
    model = _quantize_elsewhere(tmp_path, fmt)
    ops = {n.op_type for n in onnx.load(model).graph.node}
    assert ("QLinearConv" in ops) == (fmt == ortq.QuantFormat.QOperator)
    proc = run_subprocess(["compile", str(model), "--target", "ethos-u55-128", "--build-dir", str(tmp_path / "b"),
                           "--json"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    entry = json.loads(proc.stdout)
    assert entry["status"] == "passed" and entry["metrics"]["npu_offload"] == 1.0
    quant = json.loads(next((tmp_path / "b" / "stages" / "quantize").glob("*/stage.json")).read_text())
    assert quant["metrics"]["prequantized"] is True  # not quantised a second time

    tosa = Path(entry["artifacts"]["tosa"])
    io = LowerRecord.read(tosa.parent / "io.json")
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = rng.uniform(-1, 1, (1, 1, 49, 10)).astype(np.float32)
        ref = run_onnx(str(model), {"input": x})
        got = run_tosa(tosa.read_bytes(), io, {"input": x})
        for spec in io.outputs:
            name = spec.onnx_name
            assert np.max(np.abs(spec.quantize_reference(ref[name]) - got[name])) <= 1, name


def test_qoperator_elementwise_pool_and_matmul_ops(tmp_path: Path):
    """QLinearAdd, QLinearMul, QLinearSigmoid, QLinearGlobalAveragePool, QLinearMatMul and an int8 MaxPool."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.4, (4, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, 4, 1, 1)).astype(np.float32), "m"),
             numpy_helper.from_array(rng.normal(0, 0.4, (4, 6)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Add", ["c", "x"], ["a"], name="add"),
             helper.make_node("Mul", ["a", "m"], ["mu"], name="mul"),
             helper.make_node("MaxPool", ["mu"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Sigmoid", ["p"], ["s"], name="sig"),
             helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "fc"], ["y"], name="fc")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "float.onnx")
    arrays = {"x": rng.uniform(-1, 1, (16, 1, 4, 8, 8)).astype(np.float32)}
    qop = tmp_path / "qop.onnx"
    ortq.quantize_static(str(tmp_path / "float.onnx"), str(qop), ArrayReader(arrays),
                         quant_format=ortq.QuantFormat.QOperator, per_channel=False,
                         activation_type=ortq.QuantType.QInt8, weight_type=ortq.QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(qop).graph.node}
    assert {"QLinearConv", "QLinearAdd", "QLinearMul", "QLinearMatMul"} <= ops, ops

    from npubuild.frontend.qoperator import to_qdq
    from npubuild.lowering.driver import lower_model

    lowered = lower_model(to_qdq(onnx.load(qop)), "int")
    for seed in range(3):
        x = np.random.default_rng(seed).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
        ref = run_onnx(str(qop), {"x": x})["y"]
        got = run_tosa(lowered.tosa, lowered, {"x": x})["y"]
        assert np.max(np.abs(lowered.outputs[0].quantize_reference(ref) - got)) <= 1
