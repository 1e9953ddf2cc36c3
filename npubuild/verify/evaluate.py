"""evaluate stage: a spec's `evaluate:` metric on real inputs, the graph a target deploys against the float model.

The model's evaluation inputs run through the float model and the QDQ model on onnxruntime and through
what the target deploys (verify/deployed.py: the build's deployable .tflite on the virtual device, its
ethos-u operators on npu-sim and its host operators in TensorFlow Lite Micro; the family's TOSA graph only
where there is no deployable). One metric compares them; every output is given to it as
dequantized floats stacked over the samples, `{onnx output name: (N, *onnx_shape)}`.

Metrics (`evaluate.metric`), each a number for the deployed graph (`eval_score`), for the QDQ model
(`eval_qdq_score`: the quantisation's own loss, apart from the lowering's) and, where it is not a
comparison with float, for the float model (`eval_float_score`, and `eval_drop` = float - deployed):

- `top1`: accuracy of `output`'s argmax on the integer labels (the older `evaluation:` also fills
  `accuracy`, `float_accuracy` and `accuracy_drop`);
- `top1_agreement`: the fraction of rows (the output's last axis) whose argmax is float's;
- `mask_iou`: IoU of the output thresholded at `threshold` against float's, pooled over the samples;
- `detection_agreement`: the fraction of the float model's detections the deployed graph also makes:
  `output` holds per-candidate scores (N, candidates[, classes]; `logits: true` applies a sigmoid), a
  detection is a candidate whose best class reaches `threshold` (the model's own score threshold); with
  `boxes` (N, candidates, 4+: the box first, `box_format`) detections go through NMS at `iou` and match
  one to one on the same class at IoU >= `iou`, without it they match by candidate and class;
- `snr`: the output's SNR against float, dB;
- `module:function`: `function(float_outputs, int8_outputs, labels)` from `<spec dir>/<module>.py` returning a
  number (its float score is `function(float_outputs, float_outputs, labels)`). The module is loaded by
  file path from inside the project (never from sys.path) in the stage's own child process; an error in
  it, or a result that is not a finite number, is one line naming it (exit 2).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npubuild.config.schema import Evaluate
from npubuild.errors import InputError
from npubuild.fileio import write_json
from npubuild.records.evaluate import EvaluateRecord

Outputs = dict[str, np.ndarray]
MetricFn = Callable[[Outputs, Outputs, "np.ndarray | None"], "float | None"]
SCORED_BY_FLOAT = ("top1",)  # built-in metrics with a float score of their own (the others compare with float)


# --------------------------------------------------------------------------- built-in metrics


def _rows(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape(len(a), -1) if a.ndim <= 2 else a.reshape(-1, a.shape[-1])


def top1(out: str) -> MetricFn:
    def metric(flt: Outputs, got: Outputs, labels: np.ndarray | None) -> float:
        assert labels is not None
        pred = np.asarray(got[out]).reshape(len(labels), -1).argmax(1)
        return float(np.mean(pred == labels.reshape(-1)))
    return metric


def top1_agreement(out: str) -> MetricFn:
    def metric(flt: Outputs, got: Outputs, labels: np.ndarray | None) -> float:
        return float(np.mean(_rows(flt[out]).argmax(1) == _rows(got[out]).argmax(1)))
    return metric


def mask_iou(out: str, threshold: float) -> MetricFn:
    def metric(flt: Outputs, got: Outputs, labels: np.ndarray | None) -> float:
        f, g = np.asarray(flt[out]) >= threshold, np.asarray(got[out]) >= threshold
        union = int(np.count_nonzero(f | g))
        return float(np.count_nonzero(f & g) / union) if union else 1.0
    return metric


def snr(out: str) -> MetricFn:
    from npubuild.verify.numerics import snr_db

    def metric(flt: Outputs, got: Outputs, labels: np.ndarray | None) -> float:
        return snr_db(flt[out], got[out])
    return metric


def _xyxy(b: np.ndarray, box_format: str) -> np.ndarray:
    b = np.asarray(b, np.float64)[..., :4]
    if box_format == "xyxy":
        return b
    cx, cy, w, h = b[..., 0], b[..., 1], b[..., 2], b[..., 3]
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt, rb = np.maximum(a[:, None, :2], b[None, :, :2]), np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area_a, area_b = (np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), -1) for x in (a, b))
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    order, keep = list(np.argsort(-scores, kind="stable")), []
    while order:
        i = order.pop(0)
        keep.append(i)
        if order:
            overlap = _iou(boxes[i:i + 1], boxes[order])[0]
            order = [j for j, v in zip(order, overlap, strict=True) if v <= iou]
    return np.asarray(keep, int)


def detection_agreement(out: str, boxes: str | None, threshold: float, logits: bool, iou: float,
                        box_format: str) -> MetricFn:
    def detections(o: Outputs, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        s = np.asarray(o[out][i], np.float64)
        s = s.reshape(-1, s.shape[-1]) if s.ndim >= 2 else s.reshape(-1, 1)
        if logits:
            s = 1.0 / (1.0 + np.exp(-np.clip(s, -100, 100)))
        best, cls = s.max(1), s.argmax(1)
        idx = np.flatnonzero(best >= threshold)
        if boxes is None:
            return idx, cls[idx], None
        b = _xyxy(np.asarray(o[boxes][i]).reshape(s.shape[0], -1), box_format)[idx]
        keep = _nms(b, best[idx], iou)
        return idx[keep], cls[idx][keep], b[keep]

    def metric(flt: Outputs, got: Outputs, labels: np.ndarray | None) -> float | None:
        total = hits = 0
        for i in range(len(flt[out])):
            fi, fc, fb = detections(flt, i)
            gi, gc, gb = detections(got, i)
            total += len(fi)
            if fb is None or gb is None:
                hits += len(set(zip(fi.tolist(), fc.tolist(), strict=True)) & set(zip(gi.tolist(), gc.tolist(), strict=True)))
                continue
            if not len(fi) or not len(gi):
                continue
            m = _iou(fb, gb)
            m[fc[:, None] != gc[None, :]] = 0.0
            used: set[int] = set()
            for r in range(len(fi)):
                free = [j for j in np.argsort(-m[r]) if j not in used and m[r, j] >= iou]
                if free:
                    used.add(int(free[0]))
                    hits += 1
        return hits / total if total else None
    return metric


# --------------------------------------------------------------------------- the user's metric


def user_metric(ref: str, module_file: Path) -> MetricFn:
    """`module:function` loaded from its file (resolved inside the project when the spec was loaded)."""
    _, name = ref.split(":")
    spec = importlib.util.spec_from_file_location(f"npubuild_user_metric_{module_file.stem}", module_file)
    if spec is None or spec.loader is None:
        raise InputError(f"metric '{ref}': cannot load {module_file.name}", str(module_file))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's code: one line naming it
        raise InputError(f"metric '{ref}': importing {module_file.name} failed: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]}", str(module_file)) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"metric '{ref}': {module_file.name} defines no function '{name}'", str(module_file))

    def metric(flt: Outputs, got: Outputs, labels: np.ndarray | None) -> float:
        try:
            value = fn(flt, got, labels)
        except Exception as exc:  # noqa: BLE001 - the user's code: one line naming it
            raise InputError(f"metric '{ref}' raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}",
                             str(module_file)) from None
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number) or isinstance(value, bool):
            raise InputError(f"metric '{ref}' returned {str(value)[:60]!r}, not a finite number", str(module_file))
        return number
    return metric


def metric_of(cfg: Evaluate, out: str, module_file: Path | None) -> MetricFn:
    name = cfg.metric
    if ":" in name:
        assert module_file is not None
        return user_metric(name, module_file)
    if name == "top1":
        return top1(out)
    if name == "top1_agreement":
        return top1_agreement(out)
    if name == "mask_iou":
        return mask_iou(out, cfg.threshold)
    if name == "snr":
        return snr(out)
    return detection_agreement(out, cfg.boxes, cfg.threshold, cfg.logits, cfg.iou, cfg.box_format)


# --------------------------------------------------------------------------- the stage


def load_labels(path: Path, n: int, integers: bool) -> np.ndarray:
    try:
        labels = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"cannot load labels: {' '.join(str(exc).split())[:200]}", str(path)) from None
    what = "integers" if integers else "numbers"  # top1's are class indices; a user metric's anything numeric
    wrong = labels.ndim < 1 or labels.shape[0] != n or labels.dtype.kind not in "biuf"
    if wrong or (integers and (labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer))):
        raise InputError(f"labels must be {n} {what} (one per input sample), got {labels.dtype} {list(labels.shape)}",
                         str(path))
    return labels


@dataclass(frozen=True)
class EvalFiles:
    """What the evaluation reads: the float model, io.json (the lowered graphs beside it), the evaluation inputs
    and labels, the QDQ model (int builds), Vela's summary.json (the deployable beside it) where the build has a
    vela stage, and the user metric's module file."""

    float_model: Path
    io: Path
    inputs: Path
    labels: Path | None = None
    qdq: Path | None = None
    vela_summary: Path | None = None
    metric_module: Path | None = None


def evaluate_build(files: EvalFiles, cfg: Evaluate, family: str, result_out: Path) -> dict:
    """The evaluate stage's work: evaluate.json (records/evaluate.py), returned as the stage's metrics."""
    import onnx

    from npubuild.frontend.data import load_arrays
    from npubuild.records.lower import LowerRecord
    from npubuild.tosa.run import OnnxSession
    from npubuild.verify.deployed import Deployed

    float_model = onnx.load(str(files.float_model))
    inputs = load_arrays(files.inputs, float_model)
    n_all = next(iter(inputs.values())).shape[0]
    labels = load_labels(files.labels, n_all, cfg.metric == "top1") if files.labels is not None else None
    n = min(n_all, cfg.samples or n_all)
    labels = labels[:n] if labels is not None else None
    io = LowerRecord.read(files.io)
    names = [o.onnx_name for o in io.outputs]
    out = cfg.output or names[0]
    for key in ("output", "boxes"):
        if getattr(cfg, key) and getattr(cfg, key) not in names:
            raise InputError(f"evaluate.{key} '{getattr(cfg, key)}' is not a graph output (outputs: {', '.join(names)})")
    metric = metric_of(cfg, out, files.metric_module)
    deployed = Deployed(files.io.parent, io, family, files.vela_summary)
    feeds_of = [{k: v[i] for k, v in inputs.items()} for i in range(n)]
    specs = {s.onnx_name: s for s in deployed.outputs}  # how the deployed outputs are quantised

    def stack(runs: list[dict[str, np.ndarray]], raw: bool = False) -> Outputs:
        return {k: np.stack([np.asarray(specs[k].dequantize(r[k], np.float32) if raw else r[k], np.float32)
                             for r in runs]) for k in names}

    flt_session = OnnxSession(files.float_model)
    flt = stack([flt_session(f) for f in feeds_of])
    got = stack(deployed_runs(deployed, feeds_of), raw=True)
    qdq_score = None
    if files.qdq is not None:
        qdq_session = OnnxSession(files.qdq)
        qdq_score = metric(flt, stack([qdq_session(f) for f in feeds_of]), labels)
    scored_by_float = ":" in cfg.metric or cfg.metric in SCORED_BY_FLOAT
    record = EvaluateRecord(cfg.metric, metric(flt, got, labels), qdq_score,
                            metric(flt, flt, labels) if scored_by_float else None, n, deployed.engine, out,
                            deployed.note)
    result = record.to_json()
    write_json(result_out, result)
    return result


def deployed_runs(deployed, feeds_of: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The deployed graph on every sample: the first in process (its time says what the rest will take, and an
    artifact npu-sim does not model switches the engine there), the rest over worker processes
    (npubuild/fanout.py) when that time makes them worth starting."""
    import time

    from npubuild.fanout import fan_out

    if not feeds_of:
        return []
    t0 = time.perf_counter()
    first = deployed(feeds_of[0])
    rest = feeds_of[1:]
    expected_s = (time.perf_counter() - t0) * len(rest)
    return [first, *fan_out(lambda i: deployed(rest[i]), len(rest), expected_s)]
