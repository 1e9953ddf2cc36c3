"""Post-training quantisation techniques (frontend/ptq): each measurably matters on a model made for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from npbtest.quantiser_models import unequal_channels_model
from onnx import TensorProto, helper, numpy_helper

from npubuild.frontend.ptq import ranges
from npubuild.frontend.ptq.choose import Scorer
from npubuild.frontend.ptq.stats import collect
from npubuild.frontend.quantize import quantize, quantize_chosen

Q = {"per_channel": True, "symmetric_activations": False}


def _save(model: onnx.ModelProto, tmp_path: Path, name: str) -> Path:
    model.opset_import[0].version = 17
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _conv_model(rng, c=8) -> onnx.ModelProto:
    """conv 3x3 -> relu -> conv 1x1 -> output: a small CNN whose hidden activation the tests shape."""
    w1 = rng.normal(0, 0.3, (c, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (4, c, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="conv2")]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(np.zeros(c, np.float32), "b1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.zeros(4, np.float32), "b2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    return helper.make_model(g)


def test_outlier_robust_ranges_beat_minmax_when_one_sample_spikes(tmp_path: Path):
    """One calibration sample with a 40x spike sets MinMax's grid for every other: the hidden activation keeps a
    handful of levels. The per-model choice must find a range estimator that ignores it (>10 dB better)."""
    rng = np.random.default_rng(0)
    path = _save(_conv_model(rng), tmp_path, "spike")
    calib = rng.uniform(0, 1, (16, 1, 3, 16, 16)).astype(np.float32)
    calib[3, 0, :, 8, 8] = 40.0  # one pixel of one sample
    arrays = {"x": calib}
    model = onnx.load(path)
    scorer = Scorer(model, {"x": np.delete(calib, 3, axis=0)})
    minmax = quantize(path, arrays, {**Q, "method": "minmax"})
    chosen, choice = quantize_chosen(path, model, arrays, {**Q, "method": "auto", "bias_correction": False,
                                                           "equalization": False})
    assert choice.method != "minmax"
    assert set(choice.candidates) == {"minmax", "percentile", "mean_minmax", "mse"}
    assert choice.candidates[choice.method] == max(choice.candidates.values())
    assert scorer.score(chosen)[0] > scorer.score(minmax)[0] + 10.0


def test_mse_range_has_the_least_error_of_every_estimator():
    """On a heavy tail (Student's t, 1.5 degrees of freedom) and on a uniform, no other estimator's range has a
    lower expected int8 error than the MSE one; on the uniform it keeps the ends."""
    rng = np.random.default_rng(1)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Identity", ["u"], ["b"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4096]) for n in ("x", "u")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4096]) for n in ("a", "b")]))
    arrays = {"x": rng.standard_t(1.5, (8, 4096)).astype(np.float32),
              "u": rng.uniform(-1, 1, (8, 4096)).astype(np.float32)}
    stats = collect(model, arrays)
    for name in ("a", "b"):
        errors = {k: ranges.quant_mse(stats[name], *(np.array([v]) for v in est(stats[name])))[0]
                  for k, est in ranges.ESTIMATORS.items()}
        assert errors["mse"] == min(errors.values()), errors
    lo, hi = ranges.mse(stats["b"])
    assert hi > 0.95 * stats["b"].hi and lo < 0.95 * stats["b"].lo


def _depthwise_model(c=16) -> onnx.ModelProto:
    """depthwise 3x3 whose weights all sit 0.45 of an int8 step above a grid point (so every tap rounds down,
    the same way), then a 1x1 conv: the depthwise output's mean per channel is shifted by the rounding."""
    rng = np.random.default_rng(2)
    peak = rng.uniform(0.5, 1.0, c)
    steps = rng.integers(20, 100, (c, 1, 3, 3)).astype(np.float64)
    steps[:, 0, 0, 0] = 127
    wd = (peak[:, None, None, None] * (steps + np.where(steps == 127, 0, 0.45)) / 127).astype(np.float32)
    w2 = np.random.default_rng(3).normal(0, 0.5, (8, c, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], group=c, pads=[1, 1, 1, 1], name="dw"),
             helper.make_node("Conv", ["d", "w2", "b2"], ["y"], name="pw")]
    inits = [numpy_helper.from_array(wd, "wd"), numpy_helper.from_array(np.zeros(c, np.float32), "bd"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.zeros(8, np.float32), "b2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])], inits)
    return helper.make_model(g)


def test_bias_correction_removes_the_shift_weight_rounding_puts_in_a_depthwise_output(tmp_path: Path):
    path = _save(_depthwise_model(), tmp_path, "dw")
    rng = np.random.default_rng(4)
    arrays = {"x": rng.uniform(0.5, 1.5, (16, 1, 16, 12, 12)).astype(np.float32)}
    held_out = {"x": rng.uniform(0.5, 1.5, (8, 1, 16, 12, 12)).astype(np.float32)}
    model = onnx.load(path)
    plain, _ = quantize_chosen(path, model, arrays, {**Q, "method": "minmax", "bias_correction": False, "equalization": False})
    corrected, choice = quantize_chosen(path, model, arrays, {**Q, "method": "minmax", "bias_correction": True, "equalization": False})
    assert choice.bias_correction and choice.corrected_layers >= 1
    scorer = Scorer(model, held_out)
    assert scorer.score(corrected)[0] > scorer.score(plain)[0] + 3.0


def test_equalisation_evens_out_channels_a_per_tensor_activation_grid_starves(tmp_path: Path):
    from npubuild.frontend.ptq.equalize import equalise, pairs

    path = _save(unequal_channels_model(), tmp_path, "uneq")
    model = onnx.load(path)
    assert [(p.first.name, p.second.name, p.depthwise_second) for p in pairs(model)] == \
        [("conv1", "dw", True), ("dw", "pw", False)]
    rng = np.random.default_rng(6)
    arrays = {"x": rng.uniform(-1, 1, (16, 1, 3, 12, 12)).astype(np.float32)}
    held_out = {"x": rng.uniform(-1, 1, (8, 1, 3, 12, 12)).astype(np.float32)}
    equalised, count = equalise(model, arrays)
    assert count == 2
    scorer = Scorer(model, held_out)
    assert scorer.score(equalised)[0] > 100  # the same float function
    fixed = {**Q, "method": "minmax", "bias_correction": False}
    plain, _ = quantize_chosen(path, model, arrays, {**fixed, "equalization": False})
    chosen, choice = quantize_chosen(path, model, arrays, {**fixed, "equalization": True})
    assert choice.equalization
    assert scorer.score(chosen)[0] > scorer.score(plain)[0] + 6.0


def _heat_map_model(rng, c=8) -> tuple[onnx.ModelProto, float]:
    """conv 3x3 -> relu -> conv 1x1 -> sigmoid: a one-channel probability map (a text or object detector's head)
    whose logits sit at -120 on an all-zero input, so its float output there is exactly 0 (the silent rows);
    also the input gain that centres the logits of uniform inputs at 0 (the informative rows)."""
    w1 = np.abs(rng.normal(0, 0.3, (c, 3, 3, 3))).astype(np.float32)
    w2 = np.abs(rng.normal(0, 0.3, (1, c, 1, 1))).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["logits"], name="conv2"),
             helper.make_node("Sigmoid", ["logits"], ["y"], name="sigmoid")]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(np.zeros(c, np.float32), "b1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.full(1, -120.0, np.float32), "b2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 16, 16])], inits)
    # a uniform(0, 1) pixel through both convs (every weight positive, padding aside): ~ 0.5 * 27 * E|w1| ...
    per_unit = 0.5 * np.abs(w1).sum(axis=(1, 2, 3)) @ w2.reshape(-1)
    return helper.make_model(g), 120.0 / float(per_unit)


def _one_step_high(qdq: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """`qdq` with one step of `output`'s int8 grid added after its last DequantizeLinear: every value it gives
    reads one LSB higher (as a bias shifted by a rounding would make it)."""
    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    dq = next(n for n in out.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == output)
    step = next(t for t in out.graph.initializer if t.name == dq.input[1])
    dq.output[0] = output + "_grid"
    out.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(step).astype(np.float32).reshape(1),
                                                         "one_step"))
    out.graph.node.append(helper.make_node("Add", [output + "_grid", "one_step"], [output]))
    return out


def test_near_silent_rows_neither_dilute_nor_decide_the_choice(tmp_path: Path):
    """PP-OCRv4's detector scores every recipe at 89-90 dB on its calibration crops: most have no text, its
    float probability map is exactly 0 there and so is every candidate's, each such row adding the 200 dB cap.
    On a small heat-map model with 12 such rows of 16, the mean over rows (the score before) squeezes the two
    recipes' margin on the 4 informative rows to a quarter and puts both at 150+ dB, and a recipe one LSB off
    on the silent rows (a 0.004 error in a probability) loses some 300 dB there, so it ranks below one that
    clips the logits, 15+ dB worse on every informative row. The score weighs a row whose float signal is 60 dB below the rows' mean by
    that signal: it reads the informative rows' own SNR and ranks the one-LSB recipe first."""
    from npubuild.frontend.ptq.choose import _snr, output_snr

    rng = np.random.default_rng(7)
    model, gain = _heat_map_model(rng)
    path = _save(model, tmp_path, "heat")
    informative = rng.uniform(0, gain, (4, 1, 3, 16, 16)).astype(np.float32)
    calib = np.concatenate([np.zeros((12, 1, 3, 16, 16), np.float32), informative])[rng.permutation(16)]
    arrays = {"x": calib}
    scorer = Scorer(model, arrays)
    silent = [not row.any() for row in calib]
    assert all(not r[0].any() for r, s in zip(scorer.reference, silent, strict=True) if s)  # exactly 0
    assert all(r[0].mean() > 0.3 for r, s in zip(scorer.reference, silent, strict=True) if not s)

    import onnxruntime as ort

    def rows(qdq: onnx.ModelProto) -> list[np.ndarray]:
        session = ort.InferenceSession(qdq.SerializeToString(), providers=["CPUExecutionProvider"])
        return [session.run(["y"], feed)[0] for feed in scorer.feeds]

    def before(got: list[np.ndarray]) -> float:  # the mean over rows of each row's own SNR
        return float(np.mean([_snr(r[0], g) for r, g in zip(scorer.reference, got, strict=True)]))

    def on_informative(got: list[np.ndarray]) -> float:
        return float(np.mean([_snr(r[0], g) for r, g, s in zip(scorer.reference, got, silent, strict=True) if not s]))

    minmax = quantize(path, arrays, {**Q, "method": "minmax"})
    entropy = quantize(path, arrays, {**Q, "method": "entropy"})  # clips the logits: ~0.6 dB
    off = _one_step_high(minmax, "y")
    got = {k: rows(m) for k, m in (("minmax", minmax), ("entropy", entropy), ("off", off))}
    truth = {k: on_informative(g) for k, g in got.items()}
    new = {k: output_snr([r[0] for r in scorer.reference], g) for k, g in got.items()}
    old = {k: before(g) for k, g in got.items()}
    assert truth["off"] > truth["entropy"] + 10  # one LSB costs little where there is signal
    for k in got:  # the score is the informative rows' own
        assert abs(new[k] - truth[k]) < 1e-9, (k, new, truth)
        assert scorer.score({"minmax": minmax, "entropy": entropy, "off": off}[k])[0] == new[k]
    assert old["minmax"] > 150 and old["entropy"] > 150  # the silent rows' cap, whatever the recipe
    assert abs((old["minmax"] - old["entropy"]) - (truth["minmax"] - truth["entropy"]) / 4) < 1e-6
    assert old["off"] < old["entropy"] - 100  # before: the one-LSB recipe far below the clipping one
    assert new["off"] > new["entropy"] + 10  # now: as far above it as it is on the rows with signal


def _ort_ranges(path: Path, arrays: dict[str, np.ndarray], method: str) -> dict[str, tuple[float, float]]:
    """onnxruntime's own calibrator at its defaults (as a plain quantize_static call runs it): each tensor's range."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import create_calibrator

    from npubuild.frontend.quantize import ArrayReader

    cal = create_calibrator(str(path), None, augmented_model_path=str(path.with_suffix(f".{method}.aug.onnx")),
                            calibrate_method=getattr(CalibrationMethod, method))
    cal.collect_data(ArrayReader(arrays))
    return {k: tuple(float(np.asarray(v).ravel()[0]) for v in td.range_value) for k, td in cal.compute_data().data.items()}


def test_onnxruntimes_calibrations_are_among_the_choices_candidates(tmp_path: Path):
    """The choice can never score below a plain quantize_static on its own measure: its minmax ranges are
    onnxruntime's MinMax, its percentile ranges onnxruntime's Percentile (own histogram: within 0.5% of the
    width), and onnxruntime's Entropy at its defaults (128 bins, 128 quantized bins: one candidate threshold)
    is MinMax. On calibration with one spiking sample the chosen model scores at least as well as a plain
    quantize_static with either calibrator."""
    rng = np.random.default_rng(3)
    path = _save(_conv_model(rng), tmp_path, "peers")
    calib = rng.uniform(0, 1, (16, 1, 3, 16, 16)).astype(np.float32)
    calib[5, 0, :, 4, 4] = 25.0
    arrays = {"x": calib}
    model = onnx.load(path)
    stats = collect(model, arrays)
    ort = {m: _ort_ranges(path, arrays, m) for m in ("MinMax", "Percentile", "Entropy")}
    assert set(ort["MinMax"]) >= {"h", "r", "y"}
    for name in ("h", "r", "y"):
        assert np.allclose(ranges.minmax(stats[name]), ort["MinMax"][name], rtol=1e-6, atol=1e-6)
        assert np.allclose(ort["Entropy"][name], ort["MinMax"][name], rtol=1e-6, atol=1e-6)
        lo, hi = ranges.percentile(stats[name])
        ref = ort["Percentile"][name]
        assert abs((hi - lo) - (ref[1] - ref[0])) <= 0.005 * (ref[1] - ref[0]), (name, (lo, hi), ref)
    scorer = Scorer(model, arrays)
    chosen, choice = quantize_chosen(path, model, arrays, {**Q, "method": "auto", "bias_correction": "auto",
                                                           "equalization": "auto"})
    best = sum(scorer.score(chosen))
    for method in ("minmax", "percentile"):  # a spec naming it: onnxruntime's own calibrator
        plain = quantize(path, arrays, {**Q, "method": method})
        assert best >= sum(scorer.score(plain)) - 0.05, (method, choice.candidates)
