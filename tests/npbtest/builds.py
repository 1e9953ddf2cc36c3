"""Small models and specs for the build-level tests (partitioning, offloads, pools, firmware, performance)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def compare_select_model() -> onnx.ModelProto:
    """Conv -> (Greater, Relu) -> Where -> Conv: Greater and Where lower to GREATER and SELECT, which
    Ethos-U85 runs and Ethos-U55/U65 do not."""
    rng = np.random.default_rng(0)
    w1 = rng.uniform(-1, 1, (8, 4, 3, 3)).astype(np.float32)
    w2 = rng.uniform(-1, 1, (8, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Greater", ["c", "thr"], ["g"], name="gt"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Where", ["g", "c", "r"], ["s"], name="sel"),
             helper.make_node("Conv", ["s", "w2"], ["y"], name="conv_b")]
    graph = helper.make_graph(
        nodes, "cmp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
         numpy_helper.from_array(np.array(0.25, np.float32), "thr")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def write_spec(project: Path, name: str, model_file: str, input_shape: list[int], targets: str,
               expect: str = "{}", extra: str = "") -> Path:
    spec = project / "configs" / f"{name}.yaml"
    spec.write_text(f"""version: 1
name: {name}
models:
  m:
    path: models/{model_file}
    input_shapes: {{x: {input_shape}}}
    calibration: {{random: {{samples: 16, seed: 0}}}}
targets: {targets}
verify: {{tosa: true, samples: 4}}
expect: {expect}
{extra}""")
    return spec


def add_compare_model(project: Path, name: str = "cmp", targets: str = "[ethos-u55-128, ethos-u85-256]",
                      expect: str = "{}") -> Path:
    onnx.save(compare_select_model(), project / "configs" / "models" / "cmp.onnx")
    return write_spec(project, name, "cmp.onnx", [1, 4, 8, 8], targets, expect)


def conv_chain_model(size: int = 48, channels: int = 16) -> onnx.ModelProto:
    """Three 3x3 convs on a size x size map: feature maps big enough for cascading and SRAM size to matter."""
    rng = np.random.default_rng(1)
    inits, nodes, prev, cin = [], [], "x", 4
    for i in range(3):
        w = rng.uniform(-0.5, 0.5, (channels, cin, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}" if i < 2 else "y"], name=f"relu{i}"))
        prev, cin = f"r{i}", channels
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def custom_op_model(domain: str, op: str) -> onnx.ModelProto:
    """Conv, then one node of op type `op` in `domain` (a custom op, or one onnxruntime has no kernel for)."""
    w = numpy_helper.from_array(np.random.default_rng(0).uniform(-1, 1, (4, 4, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node(op, ["c"], ["y"], name="my_foo", domain=domain)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 4, 4])], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    m.ir_version = 8
    return m


def sensitive_conv_model(rng: np.random.Generator | None = None) -> onnx.ModelProto:
    """Four 1x1/3x3 convs; conv2's output channel 0 is 100x the others and conv3 ignores it: int8 at conv2's
    output spends its grid on that channel (the model 3 dB from float), every other activation is benign: the one
    layer `precision: auto` must promote."""
    rng = rng if rng is not None else np.random.default_rng(0)
    def exact(shape):
        k = rng.integers(-127, 128, shape)
        k[:, ..., 0] = 127
        return (k / 127 * 0.5).astype(np.float32)

    w1, w2, w3, w4 = exact((8, 3, 3, 3)), exact((8, 8, 1, 1)), exact((8, 8, 1, 1)), exact((4, 8, 1, 1))
    w2[0, :, 0, 0] = 50.0
    w3[:, 0] = 0.0
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Conv", ["h1", "w2"], ["h2"], name="conv2"),
             helper.make_node("Conv", ["h2", "w3"], ["h3"], name="conv3"),
             helper.make_node("Conv", ["h3", "w4"], ["y"], name="conv4")]
    inits = [numpy_helper.from_array(w, n) for n, w in (("w1", w1), ("w2", w2), ("w3", w3), ("w4", w4))]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def tiny_project(root: Path, specs: int) -> list[Path]:
    """A product repo under `root` with `specs` specs of one tiny conv chain each (ethos-u55-128): their model
    files (to edit between builds)."""
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    models = []
    for i in range(specs):
        path = root / "configs" / "models" / f"m{i}.onnx"
        onnx.save(conv_chain_model(8, 8), path)
        write_spec(root, f"s{i}", path.name, [1, 4, 8, 8], "[ethos-u55-128]")
        models.append(path)
    return models


def flip_weight_signs(path: Path, seed: int) -> None:
    """Edit a model file in place: its first initializer's signs flipped at random (same shapes, new outputs)."""
    model = onnx.load(str(path))
    w = model.graph.initializer[0]
    a = numpy_helper.to_array(w)
    w.CopyFrom(numpy_helper.from_array((a * np.random.default_rng(seed).choice([-1.0, 1.0], a.shape))
                                       .astype(np.float32), w.name))
    onnx.save(model, path)
