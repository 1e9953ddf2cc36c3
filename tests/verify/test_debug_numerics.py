"""debug-numerics: every node's output on the TOSA reference model vs onnxruntime, and the first error jump."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from npbtest import REPO, read_report, run_cli
from onnx import numpy_helper

from npubuild.frontend.quantize import quantize
from npubuild.verify.debug_numerics import layer_numerics

PASSES = ["eliminate_identity", "eliminate_dropout", "remove_unused", "topological_sort"]
DIGITS = REPO / "configs" / "models" / "digits_cnn.onnx"


def _digits_project(tmp_path: Path, calib: np.ndarray) -> Path:
    root = tmp_path / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    shutil.copy(DIGITS, root / "configs" / "models" / "digits_cnn.onnx")
    np.save(root / "configs" / "calib.npy", calib)
    for f in ("digits_eval_inputs.npy", "digits_eval_labels.npy"):
        shutil.copy(REPO / "configs" / "data" / f, root / "configs" / f)
    (root / "configs" / "d.yaml").write_text(
        "version: 1\nname: d\nmodels:\n  cnn:\n    path: models/digits_cnn.onnx\n    calibration: {npy: calib.npy}\n"
        "    evaluation: {inputs: digits_eval_inputs.npy, labels: digits_eval_labels.npy, samples: 16}\n"
        "targets: [ethos-u55-128]\nverify: {samples: 6}\n")
    return root


def _inputs(n: int) -> np.ndarray:
    return np.load(REPO / "configs" / "data" / "digits_eval_inputs.npy")[:n]


def test_well_calibrated_model_has_no_jump(tmp_path: Path, capsys):
    root = _digits_project(tmp_path, np.load(REPO / "configs" / "data" / "digits_calib.npy"))
    code, out, err = run_cli(["debug-numerics", "configs/d.yaml", "--build-dir", "b", "--json"], capsys, cwd=root)
    assert code == 0, err
    res = json.loads(out)
    nodes = [r["node"] for r in res["layers"]]
    assert nodes == ["input", "conv1", "pool1", "conv2", "pool2", "flatten", "fc"]
    assert res["first_jump"] is None and res["first_lowering_error"] is None
    for r in res["layers"]:
        assert r["max_error_lsb"] <= 1 and r["quant_snr_db"] > 25, r
    assert not (root / "b" / "report.json").exists()  # a side command: the project's report is the build's
    # the next build (nothing to do) shows it in the report, and keeps it while the lowering is the same ...
    assert run_cli(["build", "configs/d.yaml", "--build-dir", "b", "-q"], capsys, cwd=root)[0] == 0
    (entry,) = read_report(root / "b")["builds"]
    assert entry["layer_numerics"]["layers"] == res["layers"]
    assert run_cli(["build", "configs/d.yaml", "--build-dir", "b", "-q"], capsys, cwd=root)[0] == 0
    (entry,) = read_report(root / "b")["builds"]
    assert entry["layer_numerics"]["layers"] == res["layers"]
    # ... and drops it once the quantised model (so the lowering) changes
    np.save(root / "configs" / "calib.npy", np.load(REPO / "configs" / "data" / "digits_calib.npy")[:20])
    assert run_cli(["build", "configs/d.yaml", "--build-dir", "b", "-q"], capsys, cwd=root)[0] == 0
    (entry,) = read_report(root / "b")["builds"]
    assert "layer_numerics" not in entry


def test_all_zero_calibration_names_the_first_layer_where_error_jumps(tmp_path: Path, capsys):
    root = _digits_project(tmp_path, np.zeros((16, 1, 8, 8), np.float32))
    code, out, err = run_cli(["debug-numerics", "configs/d.yaml", "--build-dir", "b"], capsys, cwd=root)
    assert code == 0, err
    # calibrated on zeros, the input's int8 range is wrong: error enters at the very first quantised tensor
    marked = [ln for ln in out.splitlines() if "<< error jumps here" in ln]
    assert len(marked) == 1 and marked[0].split()[0] == "input"
    assert "first jump: input (SNR vs float" in out
    res = json.loads((root / "b" / "builds" / "d" / "cnn" / "ethos-u55-128" / "layers.json").read_text())
    assert res["first_jump"] == "input" and res["layers"][0]["quant_snr_db"] < 20
    # the integer graph still matches its (badly calibrated) QDQ model: a calibration problem, not a lowering bug
    assert res["first_lowering_error"] is None


def test_a_layer_with_a_clipping_range_is_named(tmp_path: Path):
    qdq = quantize(DIGITS, {"input": np.load(REPO / "configs" / "data" / "digits_calib.npy")[:, None]},
                   {"per_channel": True, "method": "minmax", "symmetric_activations": False})
    for init in qdq.graph.initializer:  # conv2's output range 30x too narrow: it clips
        if init.name == "relu2_scale":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) / 30, init.name))
    res = layer_numerics(qdq, onnx.load(DIGITS), PASSES, "int", {"input": _inputs(6)[:, None]})
    assert res["first_jump"] == "conv2"
    by = {r["node"]: r for r in res["layers"]}
    assert by["pool1"]["quant_snr_db"] > 30 and by["conv2"]["quant_snr_db"] < 10


def test_fp_profile_compares_float_tensors():
    model = onnx.load(DIGITS)
    res = layer_numerics(model, model, PASSES, "fp", {"input": _inputs(3)[:, None]})
    assert [r["node"] for r in res["layers"]] == ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2", "flatten", "fc"]
    assert all(r["tosa_snr_db"] > 100 and r["max_error_lsb"] is None for r in res["layers"])
    assert res["first_jump"] is None


def test_unknown_model_is_one_line_exit_2(tmp_path: Path, capsys):
    root = _digits_project(tmp_path, np.load(REPO / "configs" / "data" / "digits_calib.npy"))
    code, _, err = run_cli(["debug-numerics", "configs/d.yaml", "--model", "nope"], capsys, cwd=root)
    assert code == 2 and "matches no build" in err and "--model cnn --target ethos-u55-128" in err
    assert err.count("\n") == 1


def test_first_jump_rules():
    from npubuild.verify.debug_numerics import first_jump

    def row(node, snr, lsb=0.0):
        return {"node": node, "quant_snr_db": snr, "tosa_snr_db": 150.0, "max_error_lsb": lsb}

    # a gradual slide from 45 to 28 dB is no jump; a fall of more than 20 dB is; so is crossing 20 dB
    assert first_jump([row("a", 45), row("b", 38), row("c", 28)])["first_jump"] is None
    assert first_jump([row("a", 45), row("b", 44), row("c", 12), row("d", 5)])["first_jump"] == "c"
    assert first_jump([row("a", 30), row("b", 24), row("c", 19)])["first_jump"] == "c"
    assert first_jump([row("a", 9), row("b", 5)])["first_jump"] == "a"
    # the integer graph leaving its QDQ model by more than one LSB is a lowering error, named apart
    res = first_jump([row("a", 45), row("b", 44, lsb=1), row("c", 43, lsb=6)])
    assert res["first_lowering_error"] == "c" and res["first_jump"] is None


def test_first_drift_names_where_the_integer_graph_loses_more_than_its_qdq_model():
    """Every node within 1 LSB of the QDQ model, yet the deployed graph falls behind it against float (a
    sensitive network growing 1-LSB steps): the first node more than 1 dB further from float is named."""
    from npubuild.verify.debug_numerics import first_jump, render_table

    def row(node, deployed, qdq):
        return {"node": node, "op_type": "Conv", "quant_snr_db": deployed, "qdq_snr_db": qdq, "tosa_snr_db": 40.0,
                "max_error_lsb": 1.0}

    rows = [row("a", 44.0, 44.2), row("b", 30.0, 30.5), row("c", 21.0, 24.0), row("d", 9.0, 12.0)]
    res = first_jump(rows)
    assert res["first_lowering_error"] is None
    assert res["first_drift"] == "c" and "24.0" in res["drift_reason"]
    table = render_table({**res, "layers": rows})
    assert "first drift from float: c" in table
    # tensors beyond what int8 keeps anyway (both over 60 dB) are no drift
    assert first_jump([row("a", 90.0, 150.0), row("b", 44.0, 44.5)])["first_drift"] is None


def test_attention_probes_fused_away_beside_others_are_dropped(tmp_path: Path):
    """Exposing a head-split Reshape stops its Transpose from fusing over it; the report keeps going without it."""
    from npubuild.models.zoo import transformer

    model = transformer(seq=8, d=16, heads=2, ffn=32, layers=1)
    for vi in (*model.graph.input, *model.graph.output):  # batch 1, as the import stage fixes it
        vi.type.tensor_type.shape.dim[0].dim_value = 1
    path = tmp_path / "t.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(0)
    calib = rng.uniform(-1, 1, (8, 1, 8, 16)).astype(np.float32)
    qdq = quantize(path, {"input": calib}, {"per_channel": True, "method": "minmax", "symmetric_activations": False})
    res = layer_numerics(qdq, model, PASSES, "int", {"input": calib[:3]})
    nodes = [r["node"] for r in res["layers"]]
    assert nodes[0] == "input" and any(n.startswith("softmax") for n in nodes)
    assert any(n.startswith("layernormalization") for n in nodes)
    assert res["first_lowering_error"] is None
    assert all(r["max_error_lsb"] <= 8 for r in res["layers"]), res["layers"]


def test_an_equalised_build_is_compared_with_the_equalised_float_model(tmp_path: Path, capsys):
    """Cross-layer equalisation divides each channel between two layers by its own factor (the graph's output is
    the same float function): the QDQ model's tensors there approximate the equalised float model's, and against
    the import's model they measured the factors (a 300x channel spread: far below 0 dB), not the quantisation."""
    from npbtest.quantiser_models import unequal_channels_model

    root = tmp_path / "product"
    (root / "configs").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    model = unequal_channels_model()
    model.opset_import[0].version = 17
    onnx.save(model, root / "configs" / "uneq.onnx")
    rng = np.random.default_rng(6)
    np.save(root / "configs" / "calib.npy", rng.uniform(-1, 1, (16, 1, 3, 12, 12)).astype(np.float32))
    (root / "configs" / "u.yaml").write_text(
        "version: 1\nname: u\nmodels:\n  m:\n    path: uneq.onnx\n    calibration: {npy: calib.npy}\n"
        "targets: [ethos-u55-128]\nverify: {samples: 4}\n"
        "quantization: {per_channel: true, method: minmax, equalization: true, bias_correction: false}\n")
    code, out, err = run_cli(["debug-numerics", "configs/u.yaml", "--build-dir", "b", "--json"], capsys, cwd=root)
    assert code == 0, err
    res = json.loads(out)
    by = {r["node"]: r for r in res["layers"]}
    assert list(by) == ["x", "conv1", "dw", "pw"]
    # conv1's output (the Relu folded into its grid) and dw's are rescaled per channel; pw's, the output, is not
    assert all(r["qdq_snr_db"] > 25 and r["quant_snr_db"] > 25 for r in res["layers"]), res["layers"]
    assert res["first_jump"] is None and res["first_drift"] is None


def test_a_build_with_a_host_node_compares_the_rest(tmp_path: Path, capsys):
    """configs/host_fallback.yaml: its LRN runs on the host (no int8 lowering). The integer graph of the rest is
    compared node by node, reading the QDQ model's own LRN output; the table says which node it left out. (It
    stopped at the LRN before: 'LRN is lowered in the FP profile only'.)"""
    root = tmp_path / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    shutil.copy(REPO / "configs" / "host_fallback.yaml", root / "configs" / "h.yaml")
    shutil.copy(REPO / "configs" / "models" / "alexnet_lrn.onnx", root / "configs" / "models" / "alexnet_lrn.onnx")
    code, out, err = run_cli(["debug-numerics", "configs/h.yaml", "--target", "ethos-u55-128", "--build-dir", "b"],
                             capsys, cwd=root)
    assert code == 0, err
    assert "on the host, not compared (the integer graph reads the QDQ model's values of their outputs): lrn_5" in out
    res = json.loads((root / "b" / "builds" / "host_fallback" / "alexnet_lrn" / "ethos-u55-128" / "layers.json")
                     .read_text())
    nodes = [r["node"] for r in res["layers"]]
    assert res["host_nodes"] == ["lrn_5"] and "lrn_5" not in nodes
    assert "conv_3" in nodes and "gemm_16" in nodes  # before and after the host node
    assert all(r["max_error_lsb"] <= 1 for r in res["layers"]) and res["first_lowering_error"] is None
