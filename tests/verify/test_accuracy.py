"""Accuracy against float on every build (issue 30): held-back samples, the per-output measures, and the default
gate that fails a build whose int8 model has collapsed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import read_report, run_cli
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.samples import SampleSource
from npubuild.records.iospec import IOSpec
from npubuild.verify.accuracy import output_accuracy, probability_outputs


def linear_model() -> onnx.ModelProto:
    """y = x @ W + b, 16 -> 8 (one FullyConnected layer on the NPU)."""
    rng = np.random.default_rng(3)
    w = rng.uniform(-1, 1, (16, 8)).astype(np.float32)
    b = rng.uniform(-0.2, 0.2, 8).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"), helper.make_node("Add", ["h", "b"], ["y"], name="bias")]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


SPEC = """version: 1
name: collapse
models:
  outliers:
    path: models/linear.onnx
    calibration: {npy: data/calib_outliers.npy}
    evaluate: {inputs: data/eval.npy, metric: snr}
  clean:
    path: models/linear.onnx
    calibration: {npy: data/calib_clean.npy}
    evaluate: {inputs: data/eval.npy, metric: snr}
targets: [ethos-u55-128]
quantization: {per_channel: true, method: minmax}
verify: {tosa: true, samples: 4}
"""


@pytest.fixture(scope="module")
def collapse_project(tmp_path_factory) -> Path:
    """One calibration file is normal inputs; the other has a sample with one input at 2000 (a sensor glitch,
    a padding value): MinMax sets the input's int8 range by it, its LSB becomes ~16, and every real input,
    within +-1, quantises to zero. The evaluation inputs are normal ones."""
    root = tmp_path_factory.mktemp("collapse") / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "configs" / "data").mkdir()
    (root / "dodo.py").write_text("# product repo marker\n")
    onnx.save(linear_model(), root / "configs" / "models" / "linear.onnx")
    rng = np.random.default_rng(0)
    clean = rng.uniform(-1, 1, (24, 16)).astype(np.float32)
    outliers = clean.copy()
    outliers[5, 3] = 2000.0
    np.save(root / "configs" / "data" / "calib_clean.npy", clean)
    np.save(root / "configs" / "data" / "calib_outliers.npy", outliers)
    np.save(root / "configs" / "data" / "eval.npy", rng.uniform(-1, 1, (16, 16)).astype(np.float32))
    (root / "configs" / "collapse.yaml").write_text(SPEC)
    return root


def _builds(build_dir: Path) -> dict[str, dict]:
    return {b["model"]: b for b in read_report(build_dir)["builds"]}


def test_a_collapsed_int8_model_fails_the_default_gate(collapse_project: Path, capsys):
    code, out, err = run_cli(["build", "--build-dir", "build"], capsys, cwd=collapse_project)
    assert code == 1, out + err
    b = _builds(collapse_project / "build")
    bad, good = b["outliers"], b["clean"]
    assert bad["status"] == "failed" and good["status"] == "passed"
    m = bad["metrics"]
    assert m["collapsed_outputs"] == 1 and m["float_samples_from"] == "evaluation" and m["float_samples"] == 4
    assert m["float_engine"] == "virtual-device"  # the deployable, as the npu-sim stage ran it
    assert m["float_snr_db"] < 3 and m["qdq_float_snr_db"] < 3  # the quantisation's loss, not the lowering's
    # the outlier blew the output's range up too: the whole signal is under one of its LSBs (not a probability)
    assert m["float_outputs"]["y"]["collapsed"] and m["float_outputs"]["y"]["probability"] is None
    assert m["eval_score"] < 3 and m["eval_qdq_score"] < 3  # evaluate: snr agrees on all 16 eval samples
    gate = next(g for g in bad["gates"] if g["name"] == "max_collapsed_outputs")
    assert gate == {"name": "max_collapsed_outputs", "metric": "collapsed_outputs", "limit": 0, "value": 1,
                    "ok": False, "default": True}
    assert "FAILED collapse/outliers/ethos-u55-128 (gate max_collapsed_outputs)" in out
    # its error line names the output and how far it is from float
    assert "error: collapse/outliers/ethos-u55-128: gate max_collapsed_outputs failed" in err and "'y' 0.0 dB" in err \
        and "the int8 model has collapsed; 16-bit activations (quantization: {activations: int16}" in err
    assert good["metrics"]["collapsed_outputs"] == 0 and good["metrics"]["float_snr_db"] > 25
    assert "vs float" in next(ln for ln in out.splitlines() if ln.startswith("ok     collapse/clean/"))
    md = (collapse_project / "build" / "report.md").read_text()
    assert "output `y` collapsed against float" in md and "**1 collapsed**" in md


def test_a_spec_relaxes_the_default_gate(collapse_project: Path, capsys):
    spec = collapse_project / "configs" / "collapse.yaml"
    spec.write_text(SPEC + "expect: {max_collapsed_outputs: null}   # known: the glitch is in the data\n")
    try:
        code, out, err = run_cli(["build", "--build-dir", "build2"], capsys, cwd=collapse_project)
    finally:
        spec.write_text(SPEC)
    assert code == 0, out + err
    bad = _builds(collapse_project / "build2")["outliers"]
    assert bad["status"] == "passed" and bad["metrics"]["collapsed_outputs"] == 1  # still measured and shown
    assert not any(g["name"] == "max_collapsed_outputs" for g in bad["gates"])


def test_sixteen_bit_activations_hold_what_the_hint_says(collapse_project: Path, capsys):
    """The int8 failure's hint, followed: the same glitch in the calibration, 16-bit activations: the input's LSB
    is 1/256 of the int8 one and the real inputs keep their levels."""
    spec = collapse_project / "configs" / "collapse.yaml"
    spec.write_text(SPEC.replace("method: minmax}", "method: minmax, activations: int16}"))
    try:
        code, out, err = run_cli(["build", "--build-dir", "build3", "--only", "outliers"], capsys,
                                 cwd=collapse_project)
    finally:
        spec.write_text(SPEC)
    assert code == 0, out + err
    m = _builds(collapse_project / "build3")["outliers"]["metrics"]
    assert m["precision"]["int16_groups"] == m["precision"]["groups"]
    assert m["collapsed_outputs"] == 0 and m["float_snr_db"] > 20


def test_a_collapse_names_the_precision_that_collapsed():
    from npubuild.report.brief import collapsed_model

    assert collapsed_model(None).startswith("the int8 model has collapsed; 16-bit activations")
    assert collapsed_model({"mode": "fixed", "int16_groups": 65, "groups": 65}).startswith(
        "the model has collapsed with every activation in 16 bits; what no integer grid holds can stay in float")
    assert collapsed_model({"mode": "auto", "int16_groups": 38, "groups": 65}) == \
        "the mixed-precision model has collapsed (38 of 65 activation groups in 16 bits; layers kept in float on " \
        "the host may hold it)"
    assert collapsed_model({"mode": "auto", "int16_groups": 8, "groups": 13, "float_layers": ["log"]}) == \
        "the mixed-precision model has collapsed (8 of 13 activation groups in 16 bits)"


def test_calibration_rows_held_back_verify_the_build(tmp_path: Path, capsys):
    """A spec with only a calibration file: 4 of its 24 rows verify against float, the quantiser sees the other 20;
    `verify.holdout: false` verifies on calibration rows and says so."""
    root = tmp_path / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "configs" / "data").mkdir()
    (root / "dodo.py").write_text("# product repo marker\n")
    onnx.save(linear_model(), root / "configs" / "models" / "linear.onnx")
    np.save(root / "configs" / "data" / "calib.npy", np.random.default_rng(1).uniform(-1, 1, (24, 16)).astype(np.float32))
    spec = SPEC.replace("name: collapse", "name: held").split("models:")[0] + """models:
  m:
    path: models/linear.onnx
    calibration: {npy: data/calib.npy}
targets: [ethos-u55-128]
"""
    (root / "configs" / "held.yaml").write_text(spec)
    (root / "configs" / "seen.yaml").write_text(spec.replace("name: held", "name: seen") + "verify: {holdout: false}\n")
    code, out, err = run_cli(["build", "--build-dir", "build"], capsys, cwd=root)
    assert code == 0, out + err
    by_spec = {b["spec"]: b["metrics"] for b in read_report(root / "build")["builds"]}
    assert (by_spec["held"]["float_samples"], by_spec["held"]["float_samples_from"]) == (4, "held-back")
    assert (by_spec["seen"]["float_samples"], by_spec["seen"]["float_samples_from"]) == (4, "calibration")
    calibrated = sorted(json.loads(p.read_text())["metrics"]["calibration_samples"]
                        for p in (root / "build" / "stages" / "quantize").glob("*/stage.json"))
    assert calibrated == [20, 24]


def test_held_back_rows_are_disjoint_from_calibration_and_seeded():
    rows = np.arange(24 * 2, dtype=np.float32).reshape(24, 2)
    src = SampleSource("held-back", 4, 1)
    held = src.held_back(24)
    kept = src.calibration_rows({"x": rows})["x"][:, 0] // 2
    assert len(held) == 4 and set(held.tolist()).isdisjoint(kept.tolist()) and len(kept) == 20
    assert np.array_equal(held, SampleSource("held-back", 4, 1).held_back(24))  # the same rows every stage
    assert len(SampleSource("held-back", 8, 1).held_back(24)) == 6  # at most a quarter of the file
    assert len(SampleSource("held-back", 4, 1).held_back(3)) == 0  # too few rows: nothing held back
    assert len(SampleSource("calibration", 4, 1).held_back(24)) == 0


def _graph(nodes: list, outputs: list[str]) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                               vis))


def test_probability_outputs_follow_value_preserving_ops():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Reshape", ["s", "shape"], ["mask"]),
             helper.make_node("Softmax", ["x"], ["p"]), helper.make_node("Identity", ["p"], ["probs"]),
             helper.make_node("Transpose", ["p"], ["moved"]), helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Concat", ["s", "r"], ["mixed"], axis=1)]
    kinds = probability_outputs(_graph(nodes, ["mask", "probs", "moved", "mixed", "r"]))
    assert kinds == {"mask": "sigmoid", "probs": "softmax"}


def test_a_select_of_two_sigmoids_is_a_probability():
    """openWakeWord's head returns one of two sigmoids through a data-dependent If, which the import makes a Where:
    its faint scores (1e-5, under int8's 1/256 step) read 0 dB against float and must not count as collapsed."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Sigmoid", ["s"], ["t"]),
             helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Greater", ["x", "s"], ["c"]),
             helper.make_node("Where", ["c", "s", "t"], ["score"]), helper.make_node("Where", ["c", "s", "r"], ["mixed"])]
    assert probability_outputs(_graph(nodes, ["score", "mixed"])) == {"score": "sigmoid"}


def test_an_output_within_its_lsb_has_not_collapsed_whatever_its_snr():
    """A probability map of near-zero values: int8 gives 0 everywhere, SNR 0 dB, error under 1 LSB: not collapsed;
    the same map with real detections lost is."""
    spec = IOSpec("p", "p", (4, 1, 8, 8), (0, 1, 2, 3), "int8", 1 / 256, -128)
    faint = np.full((4, 1, 8, 8), 0.001)
    zeros = np.full((4, 1, 8, 8), -128, np.int8)
    acc = output_accuracy(spec, faint, zeros, None, "sigmoid")
    assert acc.snr_db == pytest.approx(0.0, abs=1e-9) and acc.max_error_lsb == 0 and not acc.collapsed
    assert acc.mask_iou == 1.0  # nothing over 0.5 in either
    lit = faint.copy()
    lit[:, :, 2:5, 2:5] = 0.9
    lost = output_accuracy(spec, lit, zeros, None, "sigmoid")
    assert lost.collapsed and lost.mask_iou == 0.0 and lost.mean_error_lsb > 1
    # a regression output on a grid an outlier blew up: its signal is under one LSB, SNR 0 dB: collapsed
    wide = IOSpec("r", "r", (4, 8), (0, 1), "int8", 16.0, 0)
    signal = np.random.default_rng(0).uniform(-2, 2, (4, 8))
    assert output_accuracy(wide, signal, np.zeros((4, 8), np.int8), None, None).collapsed
