"""Dynamic inputs as exporters leave them, closed by the spec's input_shapes (frontend/input_shapes.py).

The real models' originals: torch's named axes (Silero VAD: input [batch, sequence], state [2, batch, 128]),
Paddle's `p2o.DynamicDimension.N` and -1 (PP-OCR), tf2onnx's `unk__N`. Before, a named dim at an axis other
than 0 had to be set even where another input fixes it, Paddle's -1 was taken for a fixed size that
input_shapes contradicted, and the error named only the first open dim."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import read_report, run_cli
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import InputError
from npubuild.frontend.input_shapes import resolve
from npubuild.frontend.normalise import normalise


def recurrent_model() -> onnx.ModelProto:
    """y = conv1d(input) summed with the state's first row; torch.onnx's dynamic axes."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 1, 3)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("Unsqueeze", ["input", "axes"], ["x3"], name="unsqueeze"),
             helper.make_node("Conv", ["x3", "w"], ["c"], pads=[1, 1], name="conv"),
             helper.make_node("ReduceMean", ["c", "axes2"], ["m"], keepdims=0, name="mean"),
             helper.make_node("Gather", ["state", "zero"], ["s0"], axis=0, name="first_row"),
             helper.make_node("Add", ["m", "s0"], ["y"], name="add")]
    inits = [w, axes, numpy_helper.from_array(np.array([2], np.int64), "axes2"),
             numpy_helper.from_array(np.array(0, np.int64), "zero")]
    graph = helper.make_graph(nodes, "vad", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "sequence"]),
                                             helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_named_dim_takes_its_size_wherever_it_appears():
    shapes = {s.name: s for s in resolve(recurrent_model(), {"input": [1, 64]}, "m.onnx")}
    assert shapes["state"].resolved == (2, 1, 8) and shapes["state"].origins[1] == "as 'batch'"
    assert shapes["input"].describe() == "input [batch, sequence] -> [1, 64] (input_shapes)"
    out = normalise(recurrent_model(), {"input": [1, 64]}, "m.onnx")
    dims = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in out.graph.input}
    assert dims == {"input": [1, 64], "state": [2, 1, 8]}


def test_every_open_dim_is_named_in_one_line_with_what_to_set():
    with pytest.raises(InputError) as err:
        resolve(recurrent_model(), {}, "m.onnx")
    assert str(err.value) == ("m.onnx: error: input 'input' has dynamic dim at axis 1 ('sequence'): set input_shapes "
                              "in the spec, e.g. input_shapes: {input: [1, <sequence>]}")


def test_one_named_dim_given_two_sizes_is_refused():
    with pytest.raises(InputError, match="dim 'batch' is 1 for input 'input' axis 0 but 2 for input 'state' axis 1"):
        resolve(recurrent_model(), {"input": [1, 64], "state": [2, 2, 8]}, "m.onnx")


def paddle_model() -> onnx.ModelProto:
    """PP-OCR's classifier input as Paddle2ONNX writes it: [-1, 3, -1, -1]; a 1x1 conv."""
    w = numpy_helper.from_array(np.random.default_rng(1).normal(size=(4, 3, 1, 1)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 1, 1])
    for d in x.type.tensor_type.shape.dim:
        if d.dim_value == 1:
            d.dim_value = -1
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="p2o.Conv.0")], "cls", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["p2o.DynamicDimension.3", 4, -1, -1])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


def test_paddles_minus_one_is_a_dynamic_dim():
    """Before: 'input 'x': dim -1 is fixed in the model, spec says 1'."""
    with pytest.raises(InputError, match=r"axis 2, axis 3: .*input_shapes: \{x: \[1, 3, <size>, <size>\]\}"):
        resolve(paddle_model(), {}, "m.onnx")
    out = normalise(paddle_model(), {"x": [1, 3, 16, 24]}, "m.onnx")
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 16, 24]


def test_validate_lists_the_dynamic_inputs_and_the_build_takes_the_original(tmp_path: Path, capsys):
    root = tmp_path / "p"
    (root / "models").mkdir(parents=True)
    (root / "pyproject.toml").touch()
    onnx.save(recurrent_model(), root / "models" / "vad.onnx")
    spec = root / "vad.yaml"
    spec.write_text("version: 1\nname: vad\nmodels:\n  vad:\n    path: models/vad.onnx\n"
                    "    input_shapes: {input: [1, 64]}\n    calibration: {random: {samples: 4, seed: 0}}\n"
                    "targets: [ethos-u85-256]\n")
    code, out, err = run_cli(["validate", str(spec)], capsys, cwd=root)
    assert code == 0, err
    assert "dynamic input input [batch, sequence] -> [1, 64] (input_shapes)" in out
    assert "dynamic input state [2, batch, 8] -> [2, 1, 8] (as 'batch')" in out
    code, out, err = run_cli(["build", str(spec), "--build-dir", str(root / "build"), "-q"], capsys, cwd=root)
    assert code == 0, out + err
    (build,) = read_report(root / "build")["builds"]
    assert build["status"] == "passed" and build["metrics"]["npu_offload"] == 1.0
