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
from onnxruntime import quantization as ortq

from npubuild.stages.importer import normalise
from npubuild.stages.quantize import ArrayReader
from npubuild.tosa_run import run_onnx, run_tosa


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
    io = json.loads((tosa.parent / "io.json").read_text())
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = rng.uniform(-1, 1, (1, 1, 49, 10)).astype(np.float32)
        ref = run_onnx(str(model), {"input": x})
        got = run_tosa(tosa.read_bytes(), io, {"input": x})
        for spec in io["outputs"]:
            name = spec["onnx_name"]
            ref_q = np.round(ref[name] / spec["scale"]) + spec["zero_point"]
            assert np.max(np.abs(ref_q - got[name])) <= 1, name
