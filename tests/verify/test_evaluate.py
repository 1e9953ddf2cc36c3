"""`evaluate:` (issue 30): task metrics on real inputs, what is deployed (the deployable .tflite on the virtual
device) against the float model; a user's `module:function`; its errors as one line, exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from npbtest import REPO, read_report, run_cli

from npubuild.verify.evaluate import detection_agreement, mask_iou, top1_agreement

FILES = ["models/digits_cnn.onnx", "data/digits_calib.npy", "data/digits_eval_inputs.npy", "data/digits_eval_labels.npy"]
METRICS_PY = '''import numpy as np


def accuracy(float_outputs, int8_outputs, labels):
    """top-1 on the labels, written as a user would."""
    (scores,) = int8_outputs.values()
    return float(np.mean(scores.reshape(len(labels), -1).argmax(1) == labels))


def broken(float_outputs, int8_outputs, labels):
    return 1 / 0


def not_a_number(float_outputs, int8_outputs, labels):
    return "high"
'''


def _spec(models: str, targets: str = "[ethos-u55-128]") -> str:
    return f"""version: 1
name: ev
models:
{models}targets: {targets}
verify: {{tosa: true, samples: 4}}
"""


def _model(name: str, evaluate: str) -> str:
    return f"""  {name}:
    path: models/digits_cnn.onnx
    calibration: {{npy: data/digits_calib.npy}}
    evaluate: {{inputs: data/digits_eval_inputs.npy, labels: data/digits_eval_labels.npy, samples: 120, {evaluate}}}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "product"
    for f in FILES:
        (root / "configs" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "configs" / f, root / "configs" / f)
    (root / "configs" / "metrics.py").write_text(METRICS_PY)
    (root / "dodo.py").write_text("# product repo marker\n")
    return root


def _build(project: Path, spec: str, capsys) -> tuple[int, str, str]:
    (project / "configs" / "ev.yaml").write_text(spec)
    return run_cli(["build", "--build-dir", "build"], capsys, cwd=project)


def _tosa_run(build: Path, model: str, family: str, spec) -> dict:
    """The same evaluation with no deployable given: the family's TOSA graph on the TOSA reference model."""
    from npubuild.verify.evaluate import EvalFiles, evaluate_build

    stage = build / "stages"
    [flt], [io], [qdq] = (list((stage / s).glob(f"{model}-*/{f}")) for s, f in
                          (("import", "model.onnx"), ("lower", "io.json"), ("quantize", "model_qdq.onnx")))
    root = build.parent / "configs"
    ev = spec.evaluate
    files = EvalFiles(flt, io, root / ev.inputs, root / ev.labels if ev.labels else None, qdq)
    return evaluate_build(files, ev, family, build / f"tosa-{model}.json")


def test_builtin_and_user_metrics_on_the_deployable(project: Path, capsys):
    from npubuild.config.schema import Evaluate

    spec = _spec(_model("top1", "metric: top1") + _model("user", "metric: 'metrics:accuracy'")
                 + _model("agree", "metric: top1_agreement"))
    code, out, err = _build(project, spec, capsys)
    assert code == 0, out + err
    b = {(e["model"], e["target"]): e["metrics"] for e in read_report(project / "build")["builds"]}
    top1, user = b[("top1", "ethos-u55-128")], b[("user", "ethos-u55-128")]
    assert top1["eval_metric"] == "top1" and top1["eval_samples"] == 120
    assert 0.9 < top1["eval_score"] <= 1 and top1["accuracy"] == top1["eval_score"]
    assert top1["float_accuracy"] == top1["eval_float_score"] and top1["eval_drop"] == pytest.approx(
        top1["eval_float_score"] - top1["eval_score"])
    # the user's function is given the same outputs: the same number, its float score f(float, float, labels)
    assert user["eval_score"] == top1["eval_score"] and user["eval_float_score"] == top1["float_accuracy"]
    assert user["accuracy"] is None  # accuracy* are top1's only
    agree = b[("agree", "ethos-u55-128")]
    assert agree["eval_float_score"] is None and agree["eval_drop"] is None and 0.9 < agree["eval_score"] <= 1
    # the deployable runs on the virtual device; the TOSA graph it is compiled from gives the same integers
    assert top1["eval_engine"] == "virtual-device" and "eval_engine_note" not in top1
    ev = Evaluate(inputs="data/digits_eval_inputs.npy", labels="data/digits_eval_labels.npy", samples=120,
                  metric="top1")
    tosa = _tosa_run(project / "build", "top1", "u55", type("S", (), {"evaluate": ev}))
    assert tosa["eval_engine"] == "tosa-reference" and "no vela stage" in tosa["eval_engine_note"]
    assert tosa["eval_score"] == top1["eval_score"] and tosa["eval_qdq_score"] == top1["eval_qdq_score"]
    line = next(ln for ln in out.splitlines() if ln.startswith("ok     ev/top1/ethos-u55-128"))
    assert f"top1 {top1['eval_score']:.4g}" in line


@pytest.mark.parametrize(("function", "message"), [
    ("broken", "metric 'metrics:broken' raised ZeroDivisionError: division by zero"),
    ("not_a_number", "metric 'metrics:not_a_number' returned 'high', not a finite number"),
    ("absent", "metric 'metrics:absent': metrics.py defines no function 'absent'"),
])
def test_a_user_metric_that_fails_is_one_line_exit_2(project: Path, capsys, function: str, message: str):
    code, out, err = _build(project, _spec(_model("m", f"metric: 'metrics:{function}'")), capsys)
    assert code == 2, out + err
    assert message in err and "Traceback" not in err + out


def test_a_metric_module_outside_the_spec_dir_or_missing_is_refused_at_load(project: Path, capsys):
    code, _, err = _build(project, _spec(_model("m", "metric: 'nothere:f'")), capsys)
    assert code == 2 and "ev.yaml:" in err and "metric module 'nothere' not found" in err
    code, _, err = _build(project, _spec(_model("m", "metric: '../metrics:accuracy'")), capsys)
    assert code == 2 and "unknown metric '../metrics:accuracy'" in err and err.strip().count("\n") == 0


def test_top1_needs_labels(project: Path, capsys):
    spec = _spec("""  m:
    path: models/digits_cnn.onnx
    evaluate: {inputs: data/digits_eval_inputs.npy, metric: top1}
""")
    code, _, err = _build(project, spec, capsys)
    assert code == 2 and "metric top1 needs labels" in err and "ev.yaml:" in err


def test_metric_functions():
    flt = {"p": np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])}
    got = {"p": np.array([[0.7, 0.3], [0.6, 0.4], [0.55, 0.45]])}
    assert top1_agreement("p")(flt, got, None) == pytest.approx(2 / 3)
    assert mask_iou("p", 0.5)(flt, got, None) == pytest.approx(2 / 4)  # 2 in both of the 4 over 0.5 in either
    # detections: candidates (N=1, 4 candidates, 2 classes), boxes cx, cy, w, h
    scores_f = np.array([[[0.9, 0.0], [0.0, 0.8], [0.7, 0.0], [0.1, 0.1]]])
    scores_g = np.array([[[0.8, 0.0], [0.0, 0.3], [0.0, 0.0], [0.6, 0.0]]])
    boxes = np.array([[[10, 10, 4, 4], [30, 30, 4, 4], [50, 50, 4, 4], [10.5, 10, 4, 4]]], np.float64)
    by_position = detection_agreement("s", None, 0.5, False, 0.5, "cxcywh")
    assert by_position({"s": scores_f}, {"s": scores_g}, None) == pytest.approx(1 / 3)
    with_boxes = detection_agreement("s", "b", 0.5, False, 0.5, "cxcywh")
    # float: 3 detections; int8: candidates 0 and 3 overlap (NMS keeps 0), same class as float's first: 1 of 3
    assert with_boxes({"s": scores_f, "b": boxes}, {"s": scores_g, "b": boxes}, None) == pytest.approx(1 / 3)
    shifted = boxes.copy()
    shifted[0, [0, 3], 0] += 3  # IoU <= 1/7 with float's box: no longer the same detection
    assert with_boxes({"s": scores_f, "b": boxes}, {"s": scores_g, "b": shifted}, None) == pytest.approx(0.0, abs=0)
    logits = detection_agreement("s", None, 0.5, True, 0.5, "cxcywh")
    assert logits({"s": np.array([[[2.0], [-2.0]]])}, {"s": np.array([[[0.1], [0.2]]])}, None) == 1.0
    assert by_position({"s": np.zeros((1, 3, 1))}, {"s": np.ones((1, 3, 1))}, None) is None  # nothing to find


def test_a_split_model_runs_its_host_partition_in_tflite_micro_between_npu_partitions(tmp_path: Path, capsys):
    """AlexNet-style with an int8 LRN on the host: NPU partition, host partition, NPU partition. The deployable
    runs on the virtual device (each ethos-u operator on npu-sim, the LRN's builtins in TensorFlow Lite Micro)
    with the same result as the TOSA reference model's run of the split with the LRN on onnxruntime."""
    import onnx

    from npubuild.config.schema import Evaluate
    from npubuild.models.zoo import alexnet_lrn

    root = tmp_path / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    onnx.save(alexnet_lrn(), root / "configs" / "models" / "alexnet_lrn.onnx")
    np.save(root / "configs" / "eval.npy", np.random.default_rng(7).uniform(-1, 1, (3, 3, 32, 32)).astype(np.float32))
    (root / "configs" / "split.yaml").write_text("""version: 1
name: split
models:
  alexnet_lrn:
    path: models/alexnet_lrn.onnx
    input_shapes: {input: [1, 3, 32, 32]}
    calibration: {random: {samples: 16, seed: 0}}
    evaluate: {inputs: eval.npy, metric: snr}
targets: [ethos-u55-128]
verify: {tosa: true, samples: 2}
""")
    code, out, err = run_cli(["build", "--build-dir", "build", "-q"], capsys, cwd=root)
    assert code == 0, out + err
    [m] = [e["metrics"] for e in read_report(root / "build")["builds"]]
    assert [p["kind"] for p in m["partition_graph"]] == ["npu", "host", "npu"]
    assert m["eval_engine"] == "virtual-device" and m["float_engine"] == "virtual-device"
    tosa = _tosa_run(root / "build", "alexnet_lrn", "u55",
                     type("S", (), {"evaluate": Evaluate(inputs="eval.npy", metric="snr")}))
    assert tosa["eval_engine"] == "tosa-reference"
    assert m["eval_score"] == pytest.approx(tosa["eval_score"], abs=0.05) and 20 < m["eval_score"] < 200
