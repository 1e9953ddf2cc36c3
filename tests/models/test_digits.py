"""The digits example: a CNN trained here on scikit-learn's 8x8 digits, float vs int8 accuracy on its held-out split."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import REPO, read_report, run_cli
from onnx import numpy_helper

from npubuild.models import digits

FILES = ["digits.yaml", "models/digits_cnn.onnx", "data/digits_calib.npy", "data/digits_eval_inputs.npy",
         "data/digits_eval_labels.npy"]


@pytest.fixture(scope="module")
def generated():
    return digits.generate()


def test_committed_example_is_what_the_generator_produces(generated):
    model, arrays = generated
    for name, a in arrays.items():
        committed = np.load(REPO / "configs" / "data" / f"{name}.npy")
        assert committed.dtype == a.dtype and np.array_equal(committed, a), name
    committed = {i.name: numpy_helper.to_array(i) for i in onnx.load(REPO / "configs/models/digits_cnn.onnx").graph.initializer}
    fresh = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert committed.keys() == fresh.keys()
    for k in fresh:
        assert np.allclose(committed[k], fresh[k], atol=1e-4), k
    # the held-out split is disjoint from the training data and every class is in it
    assert sorted(set(arrays["digits_eval_labels"].tolist())) == list(range(10))
    assert len(arrays["digits_eval_labels"]) == 359


def test_training_is_deterministic_and_learns(generated):
    tx, ty, ex, ey = digits.load_split()
    p = digits.train(tx[:300], ty[:300], epochs=2)
    q = digits.train(tx[:300], ty[:300], epochs=2)
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(p.items(), q.items(), strict=True))
    import onnxruntime as ort

    sess = ort.InferenceSession(generated[0].SerializeToString(), providers=["CPUExecutionProvider"])
    scores = np.concatenate([sess.run(None, {"input": ex[i:i + 1]})[0] for i in range(len(ey))])
    assert np.mean(scores.argmax(1) == ey) > 0.93


def _project(tmp_path: Path, spec_edit: tuple[str, str] | None = None) -> Path:
    root = tmp_path / "product"
    for f in FILES:
        (root / "configs" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "configs" / f, root / "configs" / f)
    (root / "dodo.py").write_text("# product repo marker\n")
    spec = root / "configs" / "digits.yaml"
    text = spec.read_text().replace("targets: [ethos-u55-128, ethos-u85-256]", "targets: [ethos-u55-128]")
    if spec_edit:
        assert spec_edit[0] in text
        text = text.replace(*spec_edit)
    spec.write_text(text)
    return root


def test_digits_spec_reports_float_and_int8_accuracy(tmp_path: Path, capsys):
    root = _project(tmp_path)
    code, _, err = run_cli(["build", "--build-dir", str(root / "build"), "-q"], capsys, cwd=root)
    assert code == 0, err
    (b,) = read_report(root / "build")["builds"]
    m = b["metrics"]
    assert m["float_accuracy"] > 0.93
    assert abs(m["float_accuracy"] - m["accuracy"]) <= 0.02  # int8 within 2 points of float
    assert m["accuracy_drop"] == pytest.approx(m["float_accuracy"] - m["accuracy"])
    gates = {g["name"]: g for g in b["gates"]}
    assert gates["min_accuracy"]["ok"] and gates["max_accuracy_drop"]["ok"]
    assert m["npu_offload"] == 1.0
    md = (root / "build" / "report.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| digits/digits_cnn/ethos-u55-128 |") and "%" in ln)
    assert f"| {m['float_accuracy']:.2%} | {m['accuracy']:.2%} |" in row
    note = row.rsplit("| skipped [", 1)[1].split("]")[0]  # the FVP's skip reason, said once under the table
    assert f"[{note}] FVP: no FVP found" in md


def test_missing_labels_file_is_one_line_exit_2(tmp_path: Path, capsys):
    root = _project(tmp_path, ("labels: data/digits_eval_labels.npy", "labels: data/nope.npy"))
    code, _, err = run_cli(["build", "--build-dir", str(root / "build"), "-q"], capsys, cwd=root)
    assert code == 2
    assert err.strip().count("\n") == 0 and "evaluation labels file 'data/nope.npy' not found" in err
    assert "digits.yaml:" in err


def test_labels_of_the_wrong_length_are_one_line_exit_2(tmp_path: Path, capsys):
    root = _project(tmp_path)
    np.save(root / "configs" / "data" / "digits_eval_labels.npy", np.zeros(5, np.int64))
    code, _, err = run_cli(["build", "--build-dir", str(root / "build"), "-q"], capsys, cwd=root)
    assert code == 2
    assert "labels must be 359 integers" in err and "Traceback" not in err
