"""The deployed integer graph against the float model: what int8 costs each output, and whether it collapsed.

The TOSA check measures the integer graph against the QDQ model it implements (LSB, SNR): that proves the
lowering, not the quantisation. A model whose int8 ranges are wrong passes that check bit for bit while it
no longer computes what the float model computes. This module measures, per graph output, the graph a
target deploys against the float model on held-back samples (frontend/samples.py: never the samples that
calibrated it):

- `snr_db` (10 log10 of the float output's power over the error's) and the QDQ model's own `qdq_snr_db`,
  so the loss the quantisation makes and the loss the lowering adds read apart;
- `max_error_lsb` / `mean_error_lsb`: the error in units of the output's LSB (the float output put on the
  output's grid, saturated as the graph's last QuantizeLinear does): an output within ~1 LSB of float is as
  good as its int8 format allows, whatever its SNR (a probability map of near-zero values has a low SNR
  and no error that matters);
- for outputs that are scores, the agreement that decides something: `top1_agreement` (a classifier's
  argmax, or a softmax's argmax at every position), `mask_iou` (a sigmoid map thresholded at 0.5),
  `decision_agreement` (one sigmoid probability per sample at 0.5). An output is a probability when the
  float graph computes it with Sigmoid, Softmax or HardSigmoid (through reshapes, transposes and
  concatenations of such);
- `collapsed`: the output carries little of the float output: SNR below COLLAPSE_SNR_DB, except a
  probability output whose mean error stays within COLLAPSE_MEAN_LSB (faint probabilities int8 rounds to
  zero). The int profile's default gate `max_collapsed_outputs: 0` fails such a build
  (config/metrics.DEFAULT_GATES, pipelines/default.yaml).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from npubuild.tosa.iospec import IOSpec
from npubuild.verify.numerics import _classes, snr_db, top1_agreement

if TYPE_CHECKING:
    import onnx

# Below 6 dB an int8 output's error is more than half the float output's amplitude (RMS): it no longer follows
# it. Healthy int8 outputs measure 20-45 dB (bench/numerics.md); on the real models (bench/real_models.md)
# the builds under 6 dB lose at the task level (orientation top-1, selfie IoU, hand landmarks), while BlazeFace's
# logits at 9 dB keep every detection: the gate is for collapse, `min_float_snr_db` and `evaluate:` for more.
# For a probability, a mean error within 1 LSB of its [0, 1] grid is the format's resolution, not a collapse.
COLLAPSE_SNR_DB = 6.0
COLLAPSE_MEAN_LSB = 1.0
PROBABILITY_THRESHOLD = 0.5
PROBABILITY_OPS = frozenset({"Sigmoid", "Softmax", "HardSigmoid"})
# ops that pass a probability through unchanged in value (a Concat: when every input is one)
_SAME_VALUES = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat",
                          "QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class OutputAccuracy:
    """One graph output of the deployed graph against the float model, over the held-back samples."""

    snr_db: float
    qdq_snr_db: float | None
    max_error_lsb: float | None  # None: the output is not quantized (a float or bool the host computes)
    mean_error_lsb: float | None
    probability: str | None  # "softmax", "sigmoid" (probability_outputs) or None
    top1_agreement: float | None = None
    mask_iou: float | None = None
    decision_agreement: float | None = None

    @property
    def collapsed(self) -> bool:
        """SNR under COLLAPSE_SNR_DB, unless the output is a probability whose error stays within its LSB (a
        map of faint probabilities: int8's 1/256 steps round them to 0 and nothing is decided differently).
        Only a probability's grid is known to be right: any other output's LSB is what calibration made it,
        and an outlier that blew its range up puts the whole signal under one LSB."""
        if self.snr_db >= COLLAPSE_SNR_DB:
            return False
        faint = self.probability is not None and self.mean_error_lsb is not None
        return not (faint and self.mean_error_lsb <= COLLAPSE_MEAN_LSB)

    def to_json(self) -> dict:
        return {**asdict(self), "collapsed": self.collapsed}


@dataclass(frozen=True)
class FloatCheck:
    """A deployed graph against the float model: per output, and the summary the report and the gates read."""

    outputs: Mapping[str, OutputAccuracy]
    samples: int
    samples_from: str  # frontend/samples.SampleSource.kind: where the samples came from

    def summary(self) -> dict:
        """The report's flat metrics (config/metrics.py): the worst output for each measure, None where no
        output has it."""
        outs = list(self.outputs.values())

        def worst(key: str, lowest: bool = True) -> float | None:
            vals = [getattr(o, key) for o in outs if getattr(o, key) is not None]
            return (min if lowest else max)(vals) if vals else None

        return {"float_snr_db": worst("snr_db"), "qdq_float_snr_db": worst("qdq_snr_db"),
                "float_max_error_lsb": worst("max_error_lsb", False),
                "float_mean_error_lsb": worst("mean_error_lsb", False),
                "float_top1_agreement": worst("top1_agreement"), "float_mask_iou": worst("mask_iou"),
                "float_decision_agreement": worst("decision_agreement"),
                "collapsed_outputs": sum(o.collapsed for o in outs),
                "float_samples": self.samples, "float_samples_from": self.samples_from}

    def to_json(self) -> dict:
        return {"samples": self.samples, "samples_from": self.samples_from,
                "outputs": {k: v.to_json() for k, v in self.outputs.items()}}

    @classmethod
    def from_json(cls, d: Mapping) -> FloatCheck:
        fields = OutputAccuracy.__dataclass_fields__
        return cls({k: OutputAccuracy(**{f: v[f] for f in fields if f in v}) for k, v in d["outputs"].items()},
                   d["samples"], d["samples_from"])


def probability_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """Graph outputs the float model computes as probabilities, by kind: "softmax" (a distribution over the
    last axis) or "sigmoid" (Sigmoid, HardSigmoid: one probability per element), through ops that keep
    values (reshapes, transposes, a Concat of the same kind)."""
    producers = {o: n for n in model.graph.node for o in n.output}

    def kind(name: str, depth: int = 0) -> str | None:
        node = producers.get(name)
        if node is None or depth > 16:
            return None
        if node.op_type in PROBABILITY_OPS:
            return "softmax" if node.op_type == "Softmax" else "sigmoid"
        if node.op_type not in _SAME_VALUES:
            return None
        data = [i for i in (node.input if node.op_type == "Concat" else node.input[:1]) if i]
        kinds = {kind(i, depth + 1) for i in data}
        if len(kinds) != 1 or None in kinds:
            return None
        k = kinds.pop()
        # a reshape or transpose can move a softmax's axis: only a sigmoid's elements stay what they are
        return k if k == "sigmoid" or node.op_type in ("Identity", "QuantizeLinear", "DequantizeLinear") else None

    found = {o.name: kind(o.name) for o in model.graph.output}
    return {k: v for k, v in found.items() if v is not None}


def mask_iou(flt: np.ndarray, got: np.ndarray, threshold: float = PROBABILITY_THRESHOLD) -> float:
    """IoU of the two masks thresholded at `threshold`, pooled over samples; 1.0 when both are empty."""
    f, g = np.asarray(flt) >= threshold, np.asarray(got) >= threshold
    union = int(np.count_nonzero(f | g))
    return float(np.count_nonzero(f & g) / union) if union else 1.0


def output_accuracy(spec: IOSpec, flt: np.ndarray, got_raw: np.ndarray, qdq: np.ndarray | None,
                    probability: str | None) -> OutputAccuracy:
    """One output over N samples (stacked on axis 0): `got_raw` the deployed graph's raw outputs (integers on
    the output's grid, or values for an unquantized output), `flt` the float model's, `qdq` the QDQ model's;
    `probability` its kind (probability_outputs) or None."""
    flt64 = np.asarray(flt, np.float64)
    got = spec.dequantize(got_raw)
    kept = np.isfinite(flt64) & np.isfinite(got)  # the float model's own inf/NaN: nothing to measure
    max_lsb = mean_lsb = None
    if spec.quantized:
        lsb = spec.lsb_error(np.where(kept, flt64, 0.0), np.where(kept, got_raw, spec.zero_point))[kept]
        max_lsb, mean_lsb = (float(lsb.max()), float(lsb.mean())) if lsb.size else (0.0, 0.0)
    qdq_snr = snr_db(flt64[kept], np.asarray(qdq, np.float64)[kept]) if qdq is not None else None
    top1 = iou = decision = None
    per_sample = int(flt64[0].size) if flt64.ndim and len(flt64) else 0
    if probability == "softmax" and flt64.ndim >= 2 and flt64.shape[-1] >= 2:
        # every position's distribution (a classifier's one row, a sequence's row per step)
        top1 = top1_agreement(flt64.reshape(-1, flt64.shape[-1]), got.reshape(-1, flt64.shape[-1]))
    elif probability == "sigmoid" and per_sample == 1:
        decision = float(np.mean((flt64 >= PROBABILITY_THRESHOLD) == (got >= PROBABILITY_THRESHOLD)))
    elif probability == "sigmoid" and per_sample > 1:
        iou = mask_iou(flt64, got)
    else:
        rows_f, rows_g = _classes(flt64), _classes(got)  # logits of a classifier
        top1 = top1_agreement(rows_f, rows_g) if rows_f is not None and rows_g is not None else None
    return OutputAccuracy(snr_db(flt64[kept], got[kept]), qdq_snr, max_lsb, mean_lsb, probability, top1, iou,
                          decision)


def float_check(outputs: Sequence[IOSpec], flt: Mapping[str, np.ndarray], got_raw: Mapping[str, np.ndarray],
                qdq: Mapping[str, np.ndarray] | None, probabilities: Mapping[str, str], samples_from: str) -> FloatCheck:
    """Every output of a deployed graph against the float model (arrays stacked over the samples)."""
    n = int(next(iter(flt.values())).shape[0]) if flt else 0
    return FloatCheck({s.onnx_name: output_accuracy(s, flt[s.onnx_name], got_raw[s.onnx_name],
                                                    qdq.get(s.onnx_name) if qdq is not None else None,
                                                    probabilities.get(s.onnx_name))
                       for s in outputs}, n, samples_from)


@dataclass(frozen=True)
class FloatChecks:
    """The TOSA check's measures against float: of the graph it checks (model.tosa, or a model's portable
    split) and of each family that deploys a graph of its own, measured on every sample (a family found
    bit-identical to model.tosa deploys model.tosa's outputs). `for_family` is what a target deploys."""

    graph: FloatCheck
    families: Mapping[str, FloatCheck]

    def for_family(self, family: str) -> FloatCheck:
        return self.families.get(family, self.graph)

    def to_json(self) -> dict:
        return {"graph": self.graph.to_json(), "families": {k: v.to_json() for k, v in self.families.items()}}

    @classmethod
    def from_json(cls, d: Mapping) -> FloatChecks:
        return cls(FloatCheck.from_json(d["graph"]), {k: FloatCheck.from_json(v) for k, v in d["families"].items()})


def stacked(per_sample: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-sample output dicts -> one array per output, samples on a new axis 0."""
    return {k: np.stack([np.asarray(s[k]) for s in per_sample]) for k in per_sample[0]} if per_sample else {}
