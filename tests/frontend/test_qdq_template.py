"""A PTQ candidate replayed from the first candidate's template is onnxruntime's own QDQ model, byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from npbtest.quantiser_models import conv_concat_gemm
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import quantization as ortq

from npubuild.frontend.ort_quantiser import QuantiserCache, linear_quantiser
from npubuild.frontend.qdq_template import TemplateQuantizer
from npubuild.frontend.quantize import ArrayReader

ACTIVATIONS = ("x", "c1", "r1", "p1", "c2", "cat", "flat", "y")


def _ranges(rng, tiny_input: bool = False) -> dict[str, list[dict]]:
    """Range overrides as ptq/ranges.py writes them; `tiny_input`: the input's range so small that conv1's bias
    scale (input scale x weight scale) is too small for its int32 values."""
    out = {}
    for name in ACTIVATIONS:
        lo, hi = -rng.uniform(0.1, 3.0), rng.uniform(0.1, 3.0)
        if name == "x" and tiny_input:
            lo, hi = -1e-5, 1e-5
        out[name] = [{"rmin": np.float32(lo), "rmax": np.float32(hi)}]
    return out


def _quantise(src: Path, out: Path, x: np.ndarray, ranges: dict, symmetric: bool = False) -> bytes:
    ortq.quantize_static(str(src), str(out), ArrayReader({"x": x}), quant_format=ortq.QuantFormat.QDQ,
                         per_channel=True, activation_type=ortq.QuantType.QInt8, weight_type=ortq.QuantType.QInt8,
                         calibrate_method=ortq.CalibrationMethod.MinMax,
                         extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True,
                                        "DedicatedQDQPair": False, "ForceQuantizeNoInputCheck": True,
                                        "TensorQuantOverrides": ranges})
    return out.read_bytes()


def _same_as_onnxruntime(tmp_path: Path, model: onnx.ModelProto, range_sets: list[dict],
                         symmetric: bool = False) -> tuple[int, QuantiserCache]:
    """Each range set quantised by onnxruntime alone and by the templated quantiser in turn (one cache, as one
    per-model choice): the same bytes every time. Returns how many were replayed."""
    src = tmp_path / "float.onnx"
    onnx.save(model, src)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 1, 3, 16, 16)).astype(np.float32)
    cache = QuantiserCache(tmp_path)
    before = TemplateQuantizer.replayed
    seen: set[bytes] = set()
    for i, ranges in enumerate(range_sets):
        own = _quantise(src, tmp_path / f"own{i}.onnx", x, ranges, symmetric)
        with linear_quantiser(cache):
            templated = _quantise(src, tmp_path / f"templated{i}.onnx", x, ranges, symmetric)
        assert templated == own, f"range set {i}"
        assert own not in seen  # every range set is a different model
        seen.add(own)
    return TemplateQuantizer.replayed - before, cache


def _scale(qdq: bytes, name: str) -> np.ndarray:
    model = onnx.load_from_string(qdq)
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def test_replayed_candidates_are_onnxruntimes_models(tmp_path: Path):
    """Four range sets (asymmetric: the Relu is removed and MaxPool/Flatten share their input's scale): the
    first is the template, the other three are replayed, each the bytes of a fresh quantize_static."""
    rng = np.random.default_rng(5)
    replayed, cache = _same_as_onnxruntime(tmp_path, conv_concat_gemm(rng), [_ranges(rng) for _ in range(4)])
    assert replayed == 3
    assert len(cache.templates) == 1 and None not in cache.templates.values()
    assert not cache.results  # nothing remembered by weight: the template quantised each weight once


def test_symmetric_activations_replay_too(tmp_path: Path):
    rng = np.random.default_rng(6)
    replayed, _ = _same_as_onnxruntime(tmp_path, conv_concat_gemm(rng), [_ranges(rng) for _ in range(3)], symmetric=True)
    assert replayed == 2


def test_weight_scale_adjustment_is_replayed(tmp_path: Path):
    """A candidate whose input range makes conv1's bias scale too small for int32: onnxruntime raises that
    weight's scales (so its int8 values too, and the bias's scale); the replay does the same."""
    rng = np.random.default_rng(7)
    sets = [_ranges(rng), _ranges(rng, tiny_input=True), _ranges(rng)]
    replayed, cache = _same_as_onnxruntime(tmp_path, conv_concat_gemm(rng, bias_scale=50.0), sets)
    assert replayed == 2
    x = np.zeros((1, 1, 3, 16, 16), np.float32)
    adjusted = _quantise(tmp_path / "float.onnx", tmp_path / "adj.onnx", x, sets[1])
    plain = _quantise(tmp_path / "float.onnx", tmp_path / "plain.onnx", x, sets[0])
    for name in ("w1_scale", "w1_quantized"):  # what the adjustment changed
        assert not np.array_equal(_scale(adjusted, name), _scale(plain, name))


def test_a_template_with_adjusted_weights_serves_the_others(tmp_path: Path):
    """The first candidate's own weights adjusted: the others put back the unadjusted ones."""
    rng = np.random.default_rng(8)
    sets = [_ranges(rng, tiny_input=True), _ranges(rng), _ranges(rng, tiny_input=True), _ranges(rng)]
    replayed, _ = _same_as_onnxruntime(tmp_path, conv_concat_gemm(rng, bias_scale=50.0), sets)
    assert replayed == 3


def test_a_structure_a_template_cannot_serve_runs_in_full(tmp_path: Path):
    """A model with its own initializer named as onnxruntime names a scale (`c2_scale`): onnxruntime keeps the
    model's tensor there, which a replay would overwrite, so that structure gets no template."""
    rng = np.random.default_rng(10)
    model = conv_concat_gemm(rng)
    model.graph.initializer.append(numpy_helper.from_array(np.array([0.5], np.float32), "c2_scale"))
    model.graph.node.append(helper.make_node("Mul", ["y", "c2_scale"], ["z"], name="mul"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 10]))
    replayed, cache = _same_as_onnxruntime(tmp_path, model, [_ranges(rng) for _ in range(3)])
    assert replayed == 0 and list(cache.templates.values()) == [None]
    assert cache.results  # its full runs share their weights' parameters (ort_quantiser's remembered functions)


def test_check_mode_compares_each_replay_with_the_full_run(tmp_path: Path, monkeypatch):
    rng = np.random.default_rng(9)
    monkeypatch.setattr(TemplateQuantizer, "check", True)
    before = TemplateQuantizer.checked
    replayed, _ = _same_as_onnxruntime(tmp_path, conv_concat_gemm(rng), [_ranges(rng) for _ in range(3)])
    assert replayed == 2 and TemplateQuantizer.checked - before == 2


def test_quantizer_class_is_put_back(tmp_path: Path):
    import importlib
    quantize = importlib.import_module("onnxruntime.quantization.quantize")  # the package's `quantize` is a function
    from onnxruntime.quantization import qdq_quantizer
    with linear_quantiser(QuantiserCache(tmp_path)):
        assert quantize.QDQQuantizer is not qdq_quantizer.QDQQuantizer
    assert quantize.QDQQuantizer is qdq_quantizer.QDQQuantizer


def _rescaled(model: onnx.ModelProto, rng) -> onnx.ModelProto:
    """The same graph with conv1's weights and bias scaled per output channel and the Gemm's weights changed
    (as cross-layer equalisation changes a model): other values, the same names, types and shapes."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    s = rng.uniform(0.5, 2.0, 8).astype(np.float32)
    for t in out.graph.initializer:
        a = numpy_helper.to_array(t)
        if t.name in ("w1", "b1"):
            a = a * s.reshape((8,) + (1,) * (a.ndim - 1))
        elif t.name == "wg":
            a = a * np.float32(1.5)
        t.CopyFrom(numpy_helper.from_array(a.astype(np.float32), t.name))
    return out


def test_a_model_alike_but_for_its_weights_is_replayed(tmp_path: Path):
    """The template's model, then the same graph with other weights and biases (the equalised candidate): each
    range set on each model the bytes of a fresh quantize_static; the second model is replayed from the
    first's template (its weights' parameters, int8 values and int32 biases recomputed), not recorded."""
    rng = np.random.default_rng(11)
    first = conv_concat_gemm(rng, bias_scale=50.0)
    second = _rescaled(first, rng)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 1, 3, 16, 16)).astype(np.float32)
    cache = QuantiserCache(tmp_path)
    before = TemplateQuantizer.replayed
    runs = [(first, _ranges(rng)), (first, _ranges(rng)), (second, _ranges(rng)), (second, _ranges(rng, True))]
    for i, (model, ranges) in enumerate(runs):
        src = tmp_path / f"float{i}.onnx"
        onnx.save(model, src)
        own = _quantise(src, tmp_path / f"own{i}.onnx", x, ranges)
        with linear_quantiser(cache):
            templated = _quantise(src, tmp_path / f"templated{i}.onnx", x, ranges)
        assert templated == own, f"run {i}"
    assert TemplateQuantizer.replayed - before == 3
    assert len(cache.templates) == 1  # the second model made no template of its own
    assert not np.array_equal(_scale(own, "w1_scale"), _scale(_quantise(tmp_path / "float0.onnx", tmp_path / "o.onnx",
                                                                         x, runs[3][1]), "w1_scale"))


def test_a_model_with_another_graph_gets_its_own_template(tmp_path: Path):
    rng = np.random.default_rng(12)
    first = conv_concat_gemm(rng)
    other = conv_concat_gemm(rng)
    other.graph.node[1].op_type = "Sigmoid"  # not removable as a Relu is: another structure
    x = np.random.default_rng(1).uniform(-1, 1, (2, 1, 3, 16, 16)).astype(np.float32)
    cache = QuantiserCache(tmp_path)
    before = TemplateQuantizer.replayed
    for i, model in enumerate((first, other)):
        src = tmp_path / f"float{i}.onnx"
        onnx.save(model, src)
        ranges = _ranges(rng)
        own = _quantise(src, tmp_path / f"own{i}.onnx", x, ranges)
        with linear_quantiser(cache):
            assert _quantise(src, tmp_path / f"templated{i}.onnx", x, ranges) == own
    assert TemplateQuantizer.replayed == before and len(cache.templates) == 2
