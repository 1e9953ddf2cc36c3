"""Does the deployed detector find what the float model finds? YOLOv8 detections of each build's deployable (run on
the virtual device: npu-sim, and TFLite Micro for host operators) against the float model's and the QDQ model's.

For a build dir holding a YOLOv8-style model (output [1, 4 + classes, anchors]: cx, cy, w, h, class scores) built
for several targets, runs the float model (import stage), the QDQ model (quantize stage) and each target's
deployable on the images of an .npy, decodes detections (score > --score, per-class NMS at IoU 0.45) and
counts the float model's detections each one matches (same class, IoU >= 0.5).

    python bench/detections.py --build-dir B --model yolov8n_nudenet_320 --images calib/yolov8n_nudenet_320.npy
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from npubuild.deploy.virtual_device import VirtualDevice
from npubuild.records.iospec import specs_from_json


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box a (x0, y0, x1, y1) with every box of b."""
    x0, y0 = np.maximum(a[0], b[:, 0]), np.maximum(a[1], b[:, 1])
    x1, y1 = np.minimum(a[2], b[:, 2]), np.minimum(a[3], b[:, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = lambda r: (r[..., 2] - r[..., 0]) * (r[..., 3] - r[..., 1])  # noqa: E731
    return inter / np.maximum(area(a) + area(b) - inter, 1e-9)


def detections(out: np.ndarray, score: float) -> list[tuple[int, np.ndarray]]:
    """(class, box) after per-class NMS of a [4 + classes, anchors] YOLOv8 head output."""
    out = np.asarray(out, np.float64).reshape(out.shape[-2], out.shape[-1])
    cx, cy, w, h = out[:4]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    cls, conf = out[4:].argmax(axis=0), out[4:].max(axis=0)
    found = []
    for c in np.unique(cls[conf > score]):
        idx = np.where((cls == c) & (conf > score))[0]
        idx = idx[np.argsort(-conf[idx])]
        while idx.size:
            found.append((int(c), boxes[idx[0]]))
            idx = idx[1:][_iou(boxes[idx[0]], boxes[idx[1:]]) < 0.45]
    return found


def matched(ref: list, got: list) -> int:
    n = 0
    used: set[int] = set()
    for c, box in ref:
        for k, (c2, b2) in enumerate(got):
            if k not in used and c2 == c and _iou(box, b2[None])[0] >= 0.5:
                used.add(k)
                n += 1
                break
    return n


def _stage(build_dir: Path, stage: str, label: str) -> Path:
    return next((build_dir / "stages" / stage).glob(f"{label}-*"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--score", type=float, default=0.25)
    args = ap.parse_args()
    images = np.load(args.images)
    report = json.loads((args.build_dir / "report.json").read_text())
    builds = [b for b in report["builds"] if b["model"] == args.model and b["status"] == "passed"]
    float_model = next(_stage(args.build_dir, "import", args.model).glob("*.onnx"))
    qdq_model = next(_stage(args.build_dir, "quantize", args.model).glob("*.onnx"))
    runners = {"float": ort.InferenceSession(str(float_model)), "QDQ": ort.InferenceSession(str(qdq_model))}
    name = runners["float"].get_inputs()[0].name
    devices = {}
    for b in builds:
        vela = _stage(args.build_dir, "vela", f"{args.model}-{b['target']}")
        summary = json.loads((vela / "summary.json").read_text())
        dep = summary["deployable"]
        devices[b["target"]] = (VirtualDevice((vela / dep["tflite"]).read_bytes()), specs_from_json(dep["inputs"]),
                                specs_from_json(dep["outputs"]))
    counts = {k: 0 for k in [*runners, *devices]}
    total = {k: 0 for k in counts}
    ref_total = 0
    for x in images:
        x = x[None].astype(np.float32)
        dets = {k: detections(r.run(None, {name: x})[0], args.score) for k, r in runners.items()}
        for t, (dev, ins, outs) in devices.items():
            y = dev.run([ins[0].to_tosa(x)])[0]
            y = outs[0].dequantize(outs[0].from_tosa(np.asarray(y).reshape(outs[0].shape)))
            dets[t] = detections(y, args.score)
        ref_total += len(dets["float"])
        for k in counts:
            counts[k] += matched(dets["float"], dets[k])
            total[k] += len(dets[k])
    print(f"{len(images)} images of {args.images.name}, score > {args.score}: {ref_total} float detections\n")
    print("| run | detections | float detections matched (IoU >= 0.5, same class) |")
    print("|---|---:|---:|")
    for k in counts:
        print(f"| {k} | {total[k]} | {counts[k]} / {ref_total} |")


if __name__ == "__main__":
    main()
