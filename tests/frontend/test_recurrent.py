"""LSTM, GRU and RNN unrolled at import (frontend/passes/recurrent.py): the unrolled float graph computes
what onnxruntime's recurrent kernels compute, for every layout, direction and option; quantised, it lowers
to int8 TOSA on the NPU within 1 LSB of onnxruntime's QDQ model, and U55's command stream is bit-exact."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from npbtest.npusim import assert_bitexact, vela_raw
from npbtest.ops import check_fp, check_int, io_dict, rand, vela_op_counts
from onnx import TensorProto, helper

from npubuild.frontend.normalise import normalise

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent_model(op: str, steps: int = 5, batch: int = 2, inputs: int = 3, hidden: int = 4,
                    direction: str = "forward", layout: int = 0, linear_before_reset: int = 0, initial: bool = False,
                    peepholes: bool = False, lens: list[int] | None = None, clip: float | None = None,
                    activations: list[str] | None = None, outputs=("Y", "Y_h", "Y_c")) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    g, dirs = GATES[op], 2 if direction == "bidirectional" else 1
    inits = [onnx.numpy_helper.from_array(rng.normal(0, 0.5, (dirs, g * hidden, inputs)).astype(np.float32), "W"),
             onnx.numpy_helper.from_array(rng.normal(0, 0.5, (dirs, g * hidden, hidden)).astype(np.float32), "R"),
             onnx.numpy_helper.from_array(rng.normal(0, 0.3, (dirs, 2 * g * hidden)).astype(np.float32), "B")]
    names = ["x", "W", "R", "B"]
    graph_in = [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                              [batch, steps, inputs] if layout else [steps, batch, inputs])]
    if lens is not None:
        inits.append(onnx.numpy_helper.from_array(np.array(lens, np.int32), "lens"))
    names.append("lens" if lens is not None else "")
    if initial:
        state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
        for name in ("h0", "c0")[:2 if op == "LSTM" else 1]:
            graph_in.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state))
            names.append(name)
    if peepholes:
        names += [""] * (7 - len(names))
        inits.append(onnx.numpy_helper.from_array(rng.normal(0, 0.3, (dirs, 3 * hidden)).astype(np.float32), "P"))
        names.append("P")
    attrs = dict(hidden_size=hidden, direction=direction, layout=layout)
    if op == "GRU":
        attrs["linear_before_reset"] = linear_before_reset
    if clip is not None:
        attrs["clip"] = clip
    if activations:
        attrs["activations"] = activations
    n_out = 3 if op == "LSTM" else 2
    outputs = [o for o in outputs if o != "Y_c" or op == "LSTM"]
    node = helper.make_node(op, names, [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")[:n_out]], **attrs)
    graph = helper.make_graph([node], "rec", graph_in, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                        for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    return model


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    return {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}


def _reference(op: str, kw: dict, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's own kernel; it has no layout=1, so that case runs the layout-0 model on transposed data."""
    if not kw.get("layout"):
        return ort.InferenceSession(recurrent_model(op, **kw).SerializeToString()).run(None, feeds)
    seq_first = recurrent_model(op, **{**kw, "layout": 0})
    outs = ort.InferenceSession(seq_first.SerializeToString()).run(
        None, {k: np.transpose(v, (1, 0, 2)) for k, v in feeds.items()})
    names = [o.name for o in seq_first.graph.output]
    return [np.transpose(v, (2, 0, 1, 3) if n == "Y" else (1, 0, 2)) for n, v in zip(names, outs, strict=True)]


FLOAT_CASES = [
    ("LSTM", {}), ("GRU", {}), ("GRU", {"linear_before_reset": 1}), ("RNN", {}),
    ("LSTM", {"direction": "bidirectional", "initial": True}), ("LSTM", {"peepholes": True, "initial": True}),
    ("GRU", {"direction": "reverse", "layout": 1, "initial": True}), ("LSTM", {"lens": [3, 3]}),
    ("GRU", {"lens": [4, 4], "direction": "bidirectional", "linear_before_reset": 1}),
    ("RNN", {"activations": ["Relu"], "clip": 1.5}), ("LSTM", {"layout": 1, "outputs": ("Y_h",)}),
    ("LSTM", {"activations": ["HardSigmoid", "Tanh", "Softsign"]}), ("RNN", {"direction": "reverse", "initial": True}),
]


@pytest.mark.parametrize("op,kw", FLOAT_CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}{x}" for k, x in v.items()) or "default")
def test_unrolled_graph_equals_the_recurrent_op(op, kw):
    model = recurrent_model(op, **kw)
    unrolled = normalise(model, {}, "<test>")
    assert op not in {n.op_type for n in unrolled.graph.node}
    rng = np.random.default_rng(1)
    feeds = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in _shapes(model).items()}
    want = _reference(op, kw, feeds)
    got = ort.InferenceSession(unrolled.SerializeToString()).run(None, feeds)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_unequal_sequence_lengths_are_left_to_the_host():
    """Per-batch lengths that differ are not static in the unrolled sense: the op stays as it is."""
    unrolled = normalise(recurrent_model("GRU", lens=[5, 3]), {}, "<test>")
    assert "GRU" in {n.op_type for n in unrolled.graph.node}


INT_CASES = [
    ("GRU", {"linear_before_reset": 1, "outputs": ("Y_h",)}),
    ("GRU", {"outputs": ("Y",)}),
    ("LSTM", {"outputs": ("Y_h",)}),
    ("LSTM", {"initial": True}),
    ("RNN", {}),
    ("GRU", {"direction": "bidirectional"}),
]


@pytest.mark.parametrize("op,kw", INT_CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}{x}" for k, x in v.items()))
def test_int8_recurrent_layer_on_the_npu(op, kw):
    """The recurrent state is an ordinary int8 tensor per step (its own calibrated scale; Y's Concat gives
    every step one): the TOSA graph matches the QDQ model to the LSB here, and runs on U55 and U85."""
    model = recurrent_model(op, batch=1, **kw)
    shapes = _shapes(model)
    check_fp(model, {k: rand(s, 1) for k, s in shapes.items()}, rtol=1e-4, atol=1e-5)
    lowered, _ = check_int(model, {k: rand((16, *s), 3) for k, s in shapes.items()},
                           {k: rand(s, 2) for k, s in shapes.items()}, max_lsb=1, qdq_semantics=True)
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu > 0, accel


def test_int8_gru_is_bit_exact_on_npu_sim():
    model = recurrent_model("GRU", batch=1, linear_before_reset=1, outputs=("Y_h",))
    shapes = _shapes(model)
    lowered, _ = check_int(model, {k: rand((16, *s), 3) for k, s in shapes.items()},
                           {k: rand(s, 2) for k, s in shapes.items()}, max_lsb=1)
    with tempfile.TemporaryDirectory() as tmp:
        assert_bitexact(lowered.tosa, io_dict(lowered), vela_raw(lowered.tosa, Path(tmp)))


@pytest.mark.parametrize("cell", ["GRU", "LSTM"])
def test_torch_exported_recurrent_layer(cell):
    """nn.GRU / nn.LSTM (batch_first) as torch.onnx writes them (Transposes, linear_before_reset for GRU)."""
    import io
    import warnings

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = getattr(torch.nn, cell)(6, 8, batch_first=True)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, x):
            y, _ = self.rnn(x)
            return self.fc(y[:, -1])

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), (torch.randn(1, 7, 6),), buf, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    model = onnx.load_from_string(buf.getvalue())
    assert cell in {n.op_type for n in model.graph.node}
    check_fp(model, {"x": rand([1, 7, 6], 1)}, rtol=1e-4, atol=1e-5)
    lowered, _ = check_int(model, {"x": rand((16, 1, 7, 6), 3)}, {"x": rand([1, 7, 6], 2)}, max_lsb=1,
                           qdq_semantics=True)
    for accel in ("ethos-u55-128", "ethos-u85-256"):
        npu, cpu = vela_op_counts(lowered.tosa, accel)
        assert cpu == 0 and npu > 0, accel
