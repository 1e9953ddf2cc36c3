"""The per-model choice of post-training quantisation, by measurement against the float model.

Every candidate recipe (an activation range estimator, with or without bias correction) is applied and
the resulting QDQ model run on the calibration samples beside the float model; the one whose outputs are
closest to float (the worst output's SNR plus the mean over outputs: an output no recipe can hold, such
as hand landmarks' presence score on crops without a hand, must not decide alone; an output's SNR leaves out
the rows where its float value is ~0, output_snr) is kept. Which recipe wins differs
per model and is not predictable from its shape (bench/ptq_real.md): MediaPipe's models need outlier-robust
ranges, a sigmoid head wants its whole range, some models lose nothing to MinMax. The choice is part of the
quantize stage's work, so it is cached with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from npubuild.frontend.ptq import ranges
from npubuild.frontend.ptq.bias_correction import correct_biases
from npubuild.frontend.ptq.equalize import equalise
from npubuild.frontend.ptq.session import session_options
from npubuild.frontend.ptq.stats import collect

AUTO_ESTIMATORS = ("minmax", "percentile", "mean_minmax", "mse")
ORT_METHODS = ("minmax", "percentile", "entropy")
MAX_SCORE_SAMPLES = 16  # calibration samples the candidates are scored on
SNR_CAP_DB = 200.0
NEAR_SILENT = 1e-6  # a row whose float signal is below this fraction of its output's mean row signal (60 dB down)


@dataclass
class Choice:
    """What the quantize stage chose and what every candidate measured (SNR vs float, dB, worst output)."""

    method: str
    bias_correction: bool
    snr_db: float | None
    candidates: dict[str, float] = field(default_factory=dict)
    corrected_layers: int = 0
    equalization: bool = False
    add_ratio: dict | None = None  # the residual sums' ratio step, where one applied (frontend/qdq_add_ratio.py)
    score: tuple[float, float] | None = None  # the chosen model's (worst, mean) SNR unrounded, for the ratio step

    def to_json(self) -> dict:
        return {"method": self.method, "bias_correction": self.bias_correction, "equalization": self.equalization,
                "snr_db": self.snr_db, "candidates": self.candidates, "corrected_layers": self.corrected_layers,
                **({"add_ratio": self.add_ratio} if self.add_ratio else {})}


def _snr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    noise = float(((ref - got) ** 2).sum())
    signal = float((ref ** 2).sum())
    if noise == 0:
        return SNR_CAP_DB
    return float(min(SNR_CAP_DB, 10 * np.log10(max(signal, 1e-30) / noise)))


def output_snr(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """One output's SNR over the scoring rows, dB: the mean over rows of each row's own (one row of outsized
    values would otherwise decide alone), a near-silent row weighed by its signal over NEAR_SILENT x the rows'
    mean. Such a row's own SNR says nothing: its float output is ~0 (a text detector's probability map on a crop
    without text), so it reads 0 dB or the 200 dB cap for every candidate, diluting every margin (PP-OCRv4's
    detector: 89-90 dB for candidates 5 dB apart on the rows with text), or about -290 dB for one a single LSB
    off, which would throw that candidate out whatever it does on the rest (bench/recipe_choice.md)."""
    snr = np.array([_snr(r, o) for r, o in zip(ref, got, strict=True)])
    signal = np.array([float((np.asarray(r, np.float64) ** 2).sum()) for r in ref])
    weight = np.minimum(1.0, signal / max(NEAR_SILENT * float(signal.mean()), 1e-300))
    if signal.mean() <= 0 or np.all(weight == 1.0):  # all silent, or none: every row counts the same
        return float(np.mean(snr))
    return float(np.sum(weight * snr) / np.sum(weight))


class Scorer:
    """The float model's outputs on the scoring samples, computed once; `score(qdq)` compares a candidate."""

    def __init__(self, float_model: onnx.ModelProto, arrays: dict[str, np.ndarray]):
        import onnxruntime as ort

        self.opts = session_options()
        session = ort.InferenceSession(float_model.SerializeToString(), self.opts, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        n = min(MAX_SCORE_SAMPLES, next(iter(arrays.values())).shape[0])
        self.feeds = [{k: np.asarray(v[i]) for k, v in arrays.items() if k in names} for i in range(n)]
        self.outputs = [o.name for o in session.get_outputs()]
        self.reference = [session.run(self.outputs, fd) for fd in self.feeds]

    def score(self, qdq: onnx.ModelProto) -> tuple[float, float]:
        """(worst output's SNR, mean output SNR) of `qdq` against float, dB (an output's: output_snr)."""
        import onnxruntime as ort

        session = ort.InferenceSession(qdq.SerializeToString(), self.opts, providers=["CPUExecutionProvider"])
        got = [session.run(self.outputs, fd) for fd in self.feeds]
        per_output = []
        for j, _ in enumerate(self.outputs):
            ref = [r[j] for r in self.reference]
            out = [g[j] for g in got]
            if np.asarray(ref[0]).dtype.kind != "f":
                continue
            per_output.append(output_snr(ref, out))
        if not per_output:
            return SNR_CAP_DB, SNR_CAP_DB
        return min(per_output), float(np.mean(per_output))


def choose(float_model: onnx.ModelProto, arrays: dict[str, np.ndarray], q: dict,
           build: Callable[[dict, onnx.ModelProto], onnx.ModelProto],
           scorer_of: Callable[[], Scorer] | None = None) -> tuple[onnx.ModelProto, Choice]:
    """The QDQ model of the best recipe and the record of the choice. `build(q, model)` quantises `model` (the
    float model, or its equalised form) with the settings `q` (its `_ranges`, when set, fixing every
    activation's range) and returns the finished QDQ model. `scorer_of` gives the Scorer of `float_model` on
    `arrays` (made once for the stage's later measures too), where there is a choice to make."""
    method, bc, eq = q.get("method", "auto"), q.get("bias_correction", "auto"), q.get("equalization", "auto")
    estimators = AUTO_ESTIMATORS if method == "auto" else (method,)
    choosing = len(estimators) > 1 or bc == "auto" or eq == "auto"
    scorer = None
    if choosing:
        scorer = scorer_of() if scorer_of is not None else Scorer(float_model, arrays)
    fixed = ranges.fixed_ranges(float_model)

    # a method the spec names that onnxruntime's calibrator has is its; under auto every range comes from the
    # one pass of statistics (ptq/stats.py) that all the candidates share
    ours = set(ranges.ESTIMATORS) if method == "auto" else set(ranges.ESTIMATORS) - set(ORT_METHODS)

    def recipes(model: onnx.ModelProto, names: tuple[str, ...], equalised: bool) -> list[_Tried]:
        stats = collect(model, arrays, histograms=any(e in ours and e in ranges.HISTOGRAM_ESTIMATORS for e in names)) \
            if any(e in ours for e in names) else None
        tried = []
        for est in names:
            settings = dict(q, method=est)
            if est in ours and stats is not None:
                settings["_ranges"] = ranges.overrides(stats, est, q["symmetric_activations"], fixed)
            qdq = build(settings, model)
            tried.append(_Tried(scorer.score(qdq) if scorer else (0.0, 0.0), est, False, equalised, qdq, 0))
        if bc is not False:  # on the best estimator's model only: it shifts means, it does not reorder the ranges
            base = max(tried, key=lambda t: sum(t.score))
            corrected = onnx.ModelProto()
            corrected.CopyFrom(base.model)
            count = correct_biases(corrected, model, arrays)  # the float layers this model was quantised from
            if count or bc is True:
                tried.append(_Tried(scorer.score(corrected) if scorer else (0.0, 0.0), base.method, True, equalised,
                                    corrected, count))
            if bc is True:
                tried = [t for t in tried if t.bias_correction]
        return tried

    tried = recipes(float_model, estimators, False) if eq is not True else []
    if eq is not False:
        equalised, pairs = equalise(float_model, arrays)
        if pairs:
            names = (max(tried, key=lambda t: sum(t.score)).method,) if tried else estimators
            tried += recipes(equalised, names, True)
        elif not tried:
            tried = recipes(float_model, estimators, False)
    best = max(tried, key=lambda t: sum(t.score))
    candidates = {t.name: round(t.score[0], 2) for t in tried} if scorer else {}
    return best.model, Choice(best.method, best.bias_correction, round(best.score[0], 2) if scorer else None,
                              candidates, best.corrected, best.equalised, score=best.score if scorer else None)


@dataclass
class _Tried:
    score: tuple[float, float]
    method: str
    bias_correction: bool
    equalised: bool
    model: onnx.ModelProto
    corrected: int

    @property
    def name(self) -> str:
        return self.method + ("+equalization" if self.equalised else "") + \
            ("+bias_correction" if self.bias_correction else "")
