"""The example models: committed files equal what the generators make, and they import and run.

The torch-exported ones are regenerated with torch (a test extra) and compared
as graph + weights, so a change in an exporter's metadata alone does not fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from npbtest import REPO, run_cli
from onnx import numpy_helper

from npubuild.frontend.normalise import normalise
from npubuild.models.__main__ import TORCH_NAMES
from npubuild.models.__main__ import main as models_main
from npubuild.models.zoo import MODELS

MODELS_DIR = REPO / "configs" / "models"
CNNS = ("ds_cnn", "mobilenet_v1", "resnet8", "autoencoder", "mobilenet_v3_block", "unet", "tcn_imu", "kws_fused_gelu",
        "alexnet_lrn")


def canonical(m: onnx.ModelProto) -> tuple:
    """Graph structure (nodes, attributes, inputs/outputs) and weights, without producer metadata."""
    nodes = [(n.op_type, n.domain, tuple(n.input), tuple(n.output),
              tuple(sorted((a.name, a.SerializeToString()) for a in n.attribute))) for n in m.graph.node]
    weights = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    io = ([i.SerializeToString() for i in m.graph.input], [o.SerializeToString() for o in m.graph.output])
    opsets = sorted((o.domain, o.version) for o in m.opset_import)
    return nodes, weights, io, opsets


def assert_same(a: onnx.ModelProto, b: onnx.ModelProto) -> None:
    """Same graph exactly; integer weights exactly, float weights to a few ULP.

    The exporters fold (BatchNorm into Conv, ...) with the CPU's float kernels, whose last bit differs
    between x86 CPUs; a real change (another seed, layer or scale) moves weights by far more.
    """
    na, wa, ioa, oa = canonical(a)
    nb, wb, iob, ob = canonical(b)
    assert na == nb and ioa == iob and oa == ob
    assert wa.keys() == wb.keys()
    for k in wa:
        assert wa[k].dtype == wb[k].dtype and wa[k].shape == wb[k].shape, k
        if np.issubdtype(wa[k].dtype, np.floating):
            scale = float(np.max(np.abs(wa[k]), initial=0.0))
            np.testing.assert_allclose(wb[k], wa[k], rtol=1e-5, atol=1e-6 * scale, err_msg=k)
        else:
            np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_committed_model_is_byte_identical_to_its_generator(name: str):
    assert (MODELS_DIR / f"{name}.onnx").read_bytes() == MODELS[name]().SerializeToString()


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_committed_torch_export_matches_a_fresh_export(name: str):
    pytest.importorskip("torch")
    from npubuild.models.torch_zoo import TORCH_MODELS

    assert_same(onnx.load(str(MODELS_DIR / f"{name}.onnx")), TORCH_MODELS[name]())


def test_the_export_comparison_fails_on_a_real_weight_change():
    model = onnx.load(str(MODELS_DIR / "resnet8_torch.onnx"))
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    t = max(changed.graph.initializer, key=lambda i: numpy_helper.to_array(i).size)
    w = numpy_helper.to_array(t).copy()
    w.flat[0] += 1e-3 * float(np.max(np.abs(w)))  # one weight by 0.1% of the tensor's range
    t.CopyFrom(numpy_helper.from_array(w, t.name))
    assert_same(model, model)
    with pytest.raises(AssertionError):
        assert_same(model, changed)


def test_every_example_has_a_spec_building_it_for_u55_and_u85():
    import yaml

    built: dict[str, set[str]] = {}
    for spec in (REPO / "configs").glob("*.yaml"):
        doc = yaml.safe_load(spec.read_text())
        for m in doc["models"].values():
            built.setdefault(Path(m["path"]).stem, set()).update(doc["targets"])
            if Path(m["path"]).stem in CNNS:
                assert doc.get("expect", {}).get("max_transposes") == 0, spec.name
    for name in [*MODELS, *TORCH_NAMES]:
        assert {"ethos-u55-128", "ethos-u85-256"} <= built.get(name, set()), name


@pytest.mark.parametrize("name", [*sorted(MODELS), *TORCH_NAMES])
def test_example_imports_to_static_shapes_and_matches_the_original(name: str):
    """The import stage (static shapes, folded constants and BatchNorm) keeps the model's function."""
    model = onnx.load(str(MODELS_DIR / f"{name}.onnx"))
    vi = model.graph.input[0]
    shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
    norm = normalise(onnx.load(str(MODELS_DIR / f"{name}.onnx")), {vi.name: shape}, name)
    ops = {n.op_type for n in norm.graph.node}
    assert not ops & {"BatchNormalization", "Constant", "Identity"}, ops
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {vi.name: x})[0]
    got = ort.InferenceSession(norm.SerializeToString()).run(None, {vi.name: x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    assert np.std(ref) > 1e-3  # a live network, not one that collapsed to a constant


def test_models_cli_writes_files_and_rejects_unknown_names(tmp_path: Path, capsys):
    assert models_main([str(tmp_path), "resnet8"]) == 0
    assert (tmp_path / "resnet8.onnx").read_bytes() == (MODELS_DIR / "resnet8.onnx").read_bytes()
    assert models_main([str(tmp_path), "resnet9"]) == 2
    assert "unknown model 'resnet9'" in capsys.readouterr().err


def test_max_transposes_gate_fails_a_build_with_a_transpose(tmp_path: Path, capsys):
    """A model whose semantics need a TRANSPOSE trips `max_transposes: 0` (exit 1, the gate named)."""
    from onnx import TensorProto, helper

    # x^T + x: the transposed and the plain tensor meet, so no layout choice can absorb the Transpose
    g = helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                           helper.make_node("Add", ["t", "x"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    root = tmp_path / "p"
    (root / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("")
    onnx.save(m, str(root / "models" / "t.onnx"))
    (root / "t.yaml").write_text("version: 1\nname: t\nmodels: {t: {path: models/t.onnx}}\n"
                                 "targets: [ethos-u85-256]\nexpect: {max_transposes: 0}\n")
    code, _, err = run_cli(["build", str(root / "t.yaml"), "--build-dir", str(root / "build"), "-q"], capsys,
                           cwd=root)
    entry = json.loads((root / "build" / "report.json").read_text())["builds"][0]
    gate = next(g for g in entry["gates"] if g["name"] == "max_transposes")
    assert code == 1 and gate["value"] >= 1 and not gate["ok"]
    assert "max_transposes" in err


def test_cnn_examples_build_fully_on_the_npu_without_transposes(tmp_path: Path, capsys):
    """ResNet-8 (ours and torch's), the autoencoder, the MobileNetV3 block and the KWS CNN with onnxruntime's fused
    com.microsoft:Gelu: U55 and U85 (and U65 for the last), every gate."""
    specs = [str(REPO / "configs" / f) for f in ("image_classification.yaml", "anomaly_detection.yaml",
                                                 "mobilenet_v3.yaml", "kws_fused_gelu.yaml")]
    code, _, err = run_cli(["build", *specs, "--build-dir", str(tmp_path / "b"), "-q", "-n", "2"], capsys,
                           cwd=tmp_path)
    builds = json.loads((tmp_path / "b" / "report.json").read_text())["builds"]
    assert code == 0, err
    assert len(builds) == 13
    for b in builds:
        m = b["metrics"]
        assert b["status"] == "passed", (b["model"], b["target"], b["errors"])
        assert m["transposes"] == 0 and m["npu_offload"] == 1.0 and m["vela_cpu_ops"] == 0
        assert m["tosa_snr_db"] >= 30 and m["quant_snr_db"] >= 30


def test_tcn_recurrent_and_mobilevit_examples_build_fully_on_the_npu(tmp_path: Path, capsys):
    """Issue 14's acceptance: the 1-D TCN, the GRU and LSTM keyword spotters and the MobileViT block build fully
    on the NPU for U55-128 and U85-256, within 1 LSB of the QDQ model and at >= 30 dB, every gate held."""
    specs = [str(REPO / "configs" / f) for f in ("imu_activity.yaml", "kws_recurrent.yaml", "mobilevit.yaml")]
    code, _, err = run_cli(["build", *specs, "--build-dir", str(tmp_path / "b"), "-q", "-n", "2"], capsys,
                           cwd=tmp_path)
    builds = json.loads((tmp_path / "b" / "report.json").read_text())["builds"]
    assert code == 0, err
    assert len(builds) == 8
    for b in builds:
        m = b["metrics"]
        assert b["status"] == "passed", (b["model"], b["target"], b["errors"])
        assert m["npu_offload"] == 1.0 and m["vela_cpu_ops"] == 0
        assert m["tosa_max_error_lsb"] <= 1 and m["tosa_snr_db"] >= 30
