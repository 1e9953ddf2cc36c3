"""Calibration choices: each method, per-channel or per-tensor weights, symmetric activations, builds and holds accuracy."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from npbtest import REPO, read_report, run_cli
from onnx import numpy_helper

CHOICES = {
    "minmax": "{per_channel: true, method: minmax}",
    "entropy": "{per_channel: true, method: entropy}",
    "percentile": "{per_channel: true, method: percentile}",
    "pertensor": "{per_channel: false, method: minmax}",
    "symmetric": "{per_channel: true, method: minmax, symmetric_activations: true}",
}


def test_every_calibration_choice_builds_and_keeps_accuracy(tmp_path: Path, capsys):
    root = tmp_path / "product"
    (root / "configs").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    for f in ("models/digits_cnn.onnx", "data/digits_calib.npy", "data/digits_eval_inputs.npy",
              "data/digits_eval_labels.npy"):
        (root / "configs" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "configs" / f, root / "configs" / f)
    for name, q in CHOICES.items():
        (root / "configs" / f"{name}.yaml").write_text(
            f"version: 1\nname: {name}\nmodels:\n  cnn:\n    path: models/digits_cnn.onnx\n"
            "    calibration: {npy: data/digits_calib.npy}\n"
            "    evaluation: {inputs: data/digits_eval_inputs.npy, labels: data/digits_eval_labels.npy, samples: 120}\n"
            f"targets: [ethos-u55-128]\nquantization: {q}\n"
            "expect: {npu_offload: 1.0, max_tosa_error_lsb: 1, max_accuracy_drop: 0.05}\n")
    code, _, err = run_cli(["build", "--build-dir", str(root / "build"), "-q"], capsys, cwd=root)
    assert code == 0, err
    builds = {b["spec"]: b for b in read_report(root / "build")["builds"]}
    assert set(builds) == set(CHOICES)
    for name, b in builds.items():
        assert b["status"] == "passed", (name, b["errors"], b["gates"])
        io = b["metrics"]["io"]
        assert io["inputs"][0]["dtype"] == "int8" and io["outputs"][0]["dtype"] == "int8"
        assert io["inputs"][0]["scale"] > 0 and io["outputs"][0]["scale"] > 0

    qdq = {}
    for stage in (root / "build" / "stages" / "quantize").iterdir():
        cfg = json.loads((stage / "stage.json").read_text())["config"]["quantization"]
        qdq[(cfg["method"], cfg["per_channel"], cfg["symmetric_activations"])] = onnx.load(stage / "model_qdq.onnx")
    assert len(qdq) == len(CHOICES)  # five distinct quantize tasks

    def inits(m):
        return {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}

    minmax = inits(qdq[("minmax", True, False)])
    # per-tensor weights: one scale per weight tensor; per-channel: one per output channel
    assert inits(qdq[("minmax", False, False)])["w2_scale"].size == 1 and minmax["w2_scale"].size == 16
    # symmetric activations: every activation zero point is 0 (minmax after ReLU puts it at -128)
    sym = inits(qdq[("minmax", True, True)])
    assert sym["relu1_zero_point"] == 0 and minmax["relu1_zero_point"] == -128
    # the methods choose different activation ranges from the same data
    scales = {m: float(inits(qdq[(m, True, False)])["relu2_scale"]) for m in ("minmax", "entropy", "percentile")}
    assert len({round(s, 9) for s in scales.values()}) == 3, scales
    assert scales["percentile"] <= scales["minmax"] and not np.isnan(scales["entropy"])
