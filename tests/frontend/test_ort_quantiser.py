"""onnxruntime's quantiser with npubuild's loops and remembered weight parameters writes the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from npbtest.quantiser_models import conv_concat_gemm
from onnxruntime import quantization as ortq

from npubuild.frontend.ort_quantiser import QuantiserCache, linear_quantiser
from npubuild.frontend.quantize import ArrayReader


def _quantise(src: Path, out: Path, x: np.ndarray) -> bytes:
    ortq.quantize_static(str(src), str(out), ArrayReader({"x": x}), quant_format=ortq.QuantFormat.QDQ,
                         per_channel=True, activation_type=ortq.QuantType.QInt8, weight_type=ortq.QuantType.QInt8,
                         extra_options={"ActivationSymmetric": False, "WeightSymmetric": True,
                                        "ForceQuantizeNoInputCheck": True})
    return out.read_bytes()


def test_quantiser_shortcuts_write_onnxruntimes_own_model(tmp_path: Path):
    """The same QDQ model, byte for byte, from onnxruntime's own functions, from the replacements, and from
    the replacements again with every weight's int values remembered from the first run."""
    rng = np.random.default_rng(5)
    src = tmp_path / "float.onnx"
    onnx.save(conv_concat_gemm(rng), src)
    x = rng.uniform(-1, 1, (4, 1, 3, 16, 16)).astype(np.float32)
    own = _quantise(src, tmp_path / "own.onnx", x)
    cache = QuantiserCache(tmp_path)
    with linear_quantiser(cache):
        first = _quantise(src, tmp_path / "first.onnx", x)
    # every weight's int values (each weight's per-channel parameters are frontend/weight_channels.py's, all
    # channels at once, not a remembered function's)
    assert len(cache.results) == 3
    with linear_quantiser(cache):
        second = _quantise(src, tmp_path / "second.onnx", x)
    assert own == first == second
    qdq = onnx.load_from_string(own)
    assert sum(n.op_type == "DequantizeLinear" for n in qdq.graph.node) > 8
    from onnxruntime.quantization import onnx_model, quant_utils
    assert onnx_model.find_by_name is quant_utils.find_by_name  # put back after the block


def _augmented(src: Path, out: Path, per_channel: bool, augment) -> onnx.ModelProto:
    """The calibrator's augmented model by `augment`, its random (uuid) initializer names numbered in order."""
    from onnxruntime.quantization.calibrate import MinMaxCalibrater

    calibrater = MinMaxCalibrater(src, augmented_model_path=str(out), per_channel=per_channel)
    augment(calibrater)
    model = onnx.load(str(out))
    names = {t.name: f"init{i}" for i, t in enumerate(model.graph.initializer) if t.name not in ("w1", "b1", "w2",
                                                                                                    "b2", "wg", "bg")}
    for t in model.graph.initializer:
        t.name = names.get(t.name, t.name)
    for n in model.graph.node:
        n.input[:] = [names.get(i, i) for i in n.input]
    return model


def test_calibrator_graph_is_onnxruntimes_own(tmp_path: Path):
    """augment_graph's model is onnxruntime's MinMaxCalibrater's: the same nodes in the same order (a ReduceMax and
    a ReduceMin before each tensor's first reader, the graph output's at the end), outputs and initializers, per
    tensor and per channel (axes as an attribute before opset 18, an input from it)."""
    from onnxruntime.quantization.calibrate import MinMaxCalibrater

    from npubuild.frontend.ort_quantiser import augment_graph

    for opset in (17, 18):
        model = conv_concat_gemm(np.random.default_rng(3))
        model.opset_import[0].version = opset
        src = tmp_path / f"float{opset}.onnx"
        onnx.save(model, src)
        for per_channel in (False, True):
            own = _augmented(src, tmp_path / "own.onnx", per_channel, MinMaxCalibrater.augment_graph)
            ours = _augmented(src, tmp_path / "ours.onnx", per_channel, augment_graph)
            assert ours.SerializeToString(deterministic=True) == own.SerializeToString(deterministic=True)
            assert sum(n.op_type == "ReduceMax" for n in ours.graph.node) >= 8


def _relu_clip_chain(rng: np.random.Generator) -> onnx.ModelProto:
    """conv -> relu -> conv -> clip -> conv, a relu whose input a second conv also reads (so its range is not
    the relu's), and a clip at the end: every branch of adjust_tensor_ranges."""
    def conv(x: str, w: str, y: str) -> onnx.NodeProto:
        return onnx.helper.make_node("Conv", [x, w], [y], pads=[1, 1, 1, 1], name=y)

    nodes = [conv("x", "w1", "c1"), onnx.helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             conv("r1", "w2", "c2"), onnx.helper.make_node("Clip", ["c2", "lo", "hi"], ["k2"], name="clip2"),
             conv("k2", "w3", "c3"), onnx.helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
             conv("c3", "w4", "c4"), onnx.helper.make_node("Add", ["r3", "c4"], ["y"], name="add")]
    inits = [onnx.numpy_helper.from_array(rng.normal(0, 0.3, (4, c, 3, 3)).astype(np.float32), f"w{i}")
             for i, c in ((1, 3), (2, 4), (3, 4), (4, 4))]
    inits += [onnx.numpy_helper.from_array(np.float32(v), n) for n, v in (("lo", 0.0), ("hi", 0.5))]
    g = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                               [1, 3, 8, 8])],
                               [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])


def test_reader_table_built_once_for_onnxruntimes_model(tmp_path: Path, monkeypatch):
    """adjust_tensor_ranges with its reader table built once: the same QDQ model, and one table where
    onnxruntime builds one per Relu and Clip."""
    from onnxruntime.quantization.onnx_model import ONNXModel

    rng = np.random.default_rng(11)
    src = tmp_path / "float.onnx"
    onnx.save(_relu_clip_chain(rng), src)
    x = rng.uniform(-1, 1, (4, 1, 3, 8, 8)).astype(np.float32)
    built = []
    table = ONNXModel.input_name_to_nodes
    monkeypatch.setattr(ONNXModel, "input_name_to_nodes", lambda self: built.append(1) or table(self))
    own = _quantise(src, tmp_path / "own.onnx", x)
    own_tables, built[:] = len(built), []
    with linear_quantiser():
        fast = _quantise(src, tmp_path / "fast.onnx", x)
    assert own == fast
    assert own_tables - len(built) == 2  # three Relu/Clip: three tables in onnxruntime's, one here
