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

The records (and the collapse rule with its thresholds) are npubuild/records/accuracy.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from npubuild.records.accuracy import FloatCheck, OutputAccuracy
from npubuild.records.iospec import IOSpec
from npubuild.verify.numerics import _classes, snr_db, top1_agreement

if TYPE_CHECKING:
    import onnx

PROBABILITY_THRESHOLD = 0.5
PROBABILITY_OPS = frozenset({"Sigmoid", "Softmax", "HardSigmoid"})
# ops that pass a probability through unchanged in value (a Concat: when every input is one)
_SAME_VALUES = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Where",
                          "QuantizeLinear", "DequantizeLinear"})


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
        # a Where picks each element from one of two values (a data-dependent If as the import selects it:
        # openWakeWord's head returns one of two sigmoids)
        data = [i for i in (node.input if node.op_type == "Concat" else node.input[1:3] if node.op_type == "Where"
                            else node.input[:1]) if i]
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
                qdq: Mapping[str, np.ndarray] | None, probabilities: Mapping[str, str], samples_from: str,
                samples: int | None = None) -> FloatCheck:
    """Every output of a deployed graph against the float model (arrays stacked over the samples: `stacked`);
    `samples` their number (default: the first output's leading axis)."""
    n = samples if samples is not None else int(next(iter(flt.values())).shape[0]) if flt else 0
    return FloatCheck({s.onnx_name: output_accuracy(s, flt[s.onnx_name], got_raw[s.onnx_name],
                                                    qdq.get(s.onnx_name) if qdq is not None else None,
                                                    probabilities.get(s.onnx_name))
                       for s in outputs}, n, samples_from)


def stacked(per_sample: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-sample output dicts -> one array per output, samples on a new axis 0. An output whose shape the data
    decides (an If the host runs whole) becomes all its elements in one flat array: SNR and LSB over every
    element, no per-sample agreement."""
    out = {}
    for k in per_sample[0] if per_sample else ():
        arrays = [np.asarray(s[k]) for s in per_sample]
        same = len({a.shape for a in arrays}) == 1
        out[k] = np.stack(arrays) if same else np.concatenate([a.ravel() for a in arrays])
    return out
