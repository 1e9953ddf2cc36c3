"""Accuracy of the sixteen real trained models (issue 30): npubuild's int8, as deployed, against the float model,
beside onnxruntime's plain quantize_static and TFLite's int8 converter on the same calibration.

    python bench/real_models.py --real DIR [--only NAME ...] [--targets T ...] [--no-peers] [--tf-python PY]
                                [--tflite-dir RAW] [--data-python PY]

DIR is a copy of ../shared/models/real with its calibration made (`calib/`; its README says how), a
project of its own for npubuild. Everything this script makes goes under DIR/.bench (the build dir, the
cache of every run below; `--work` moves it) and DIR/.bench-specs, never into this repository; the table goes to
bench/real_models.md (`--md`), rows for every model measured so far (`--only` reruns some and keeps
the others' rows from the cache).

Per model, on evaluation inputs disjoint from the calibration (bench/real_eval_data.py makes DIR/eval the
first time, with `--data-python`: a python with scikit-image, espeak-ng and sox on PATH):

- npubuild (this script's tree) builds the spec for ethos-u55-128 and ethos-u85-256 (DIR/.bench-specs extend
  DIR/specs/<name>.yaml; `npubuild build -n 2 --keep-going`: its cache makes a rerun cheap) with an
  `evaluate:` of the evaluation inputs (and, for Silero run recurrently, `feedback: {stateN: state}`): the build then verifies against float on 4 of them (its own
  collapse verdict is on held-out data) and every calibration row calibrates, as for the peers;
- float: onnxruntime on DIR/onnx/<name>.onnx; QDQ: onnxruntime on the build's model_qdq.onnx (DQ -> op -> Q
  as written, the TOSA check's reference); deployed: the build's deployable .tflite on the virtual device
  (npubuild/verify/deployed.py: each ethos-u operator's command stream on npu-sim, host operators in
  TensorFlow Lite Micro), as `evaluate:` runs it;
- onnxruntime: `quantize_static` as ../shared/models/real/quant_check.py calls it (QDQ, int8 activations
  and weights, per-channel, quant_pre_process first), once per calibrate method (MinMax, Percentile,
  Entropy, each at onnxruntime's defaults), on the same calibration file;
  Where onnxruntime's model is not all int8 (an If body, an op type outside its QDQ registry, a float graph
  input read by a Gather), its SNR carries "(f)" and the notes say which nodes read float data
  (bench/ort_placement.py): an NPU runs none of them in float, npubuild's graph is all int8;
- TFLite (the 7 models that came as .tflite; `--tf-python`, a python with tensorflow-cpu, and `--tflite-dir`,
  the originals as extracted from the wheels): bench/real_tflite.py, TFLite's own calibrator at int8.

Columns: quant SNR (npubuild's QDQ model vs float, the lowest output), deployed SNR vs float per target,
max LSB of the deployed outputs vs the QDQ model's (on the output's grid), onnxruntime's best SNR over
the three methods, TFLite's, and the task metric (bench/real_tasks.py) for each; "best" for onnxruntime
is per column (the best method for SNR need not be the best for the task). SNR is over all samples and
elements of an output (10 log10 of signal over error power, 200 when equal). A build that fails shows
its first error line. The collapse columns set the build's own verdict (its default gate on its 4 samples)
beside the same rule (npubuild/records/accuracy.py) applied to the deployed outputs on every evaluation
input, and whether the task metric was lost (LOST_TASK).

A quick loop while changing npubuild: `--only NAME --targets ethos-u85-256 --no-peers` rebuilds and measures
one model on one target and keeps every other figure from the last run.

Caching: each result is stored under DIR/.bench/cache by the sha256 of what it depends on (model files,
artifacts, calibration and evaluation arrays, the tool versions, this bench's measurement code), so a
rerun measures only what changed; `--fresh` ignores the cache.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import real_tasks  # noqa: E402

from npubuild.report.brief import failure_cause  # noqa: E402

TARGETS = ("ethos-u55-128", "ethos-u85-256")
# in the cache keys: bump when what a cached run computes changes (not for the table's layout); the
# deployed runs' keys also hold the deployable and the code that runs it, the task metrics run on every call.
# MEASURE_VERSION keys npubuild's runs (QDQ, deployed), PEER_VERSION the float model's and onnxruntime's
MEASURE_VERSION, PEER_VERSION = "2", "1"
DEPLOYED_CODE = ("npubuild/verify/deployed.py", "npubuild/deploy/virtual_device.py")
# what a figure cannot say by itself, measured once (the run that found it is in bench/real_models.md's history)
NOTES = {
    "oww_melspectrogram": "TFLite's int8 log-mel outputs 0 everywhere: its calibrator gives the power spectrum "
                          "an int8 scale of 8e8 and the STFT convolution weights a scale of 0 (tflite tensor "
                          "details of the quantised model); onnxruntime keeps a cosine of 0.46: int8 alone cannot "
                          "hold this front end (issue 30: the 16-bit activations issue takes it)",
}
NOTES.update({
    "oww_hey_jarvis": "onnxruntime's 46.2 dB model runs the If's then-branch (the second stage, whose sigmoid is the "
                      "output whenever the first stage fires) in float: quantize_static leaves If bodies "
                      "unquantised. On the If-inlined graph npubuild imports, with every op int8 as the NPU runs "
                      "it, onnxruntime's MinMax gives 31.0 dB, npubuild's figure (32.2 dB when it also leaves the "
                      "layer norms' ReduceMean/Sqrt outputs float, outside its QDQ registry: one window of 160 "
                      "makes the 1.2 dB); every tensor is within 0.1-2 dB of npubuild's; on the fired windows the "
                      "error is 0.013 (npubuild) vs 0.018 (onnxruntime, same graph). 16-bit activations "
                      "(quantization.activations: int16): 32.1 dB",
    **dict.fromkeys(("silero_vad_ifless", "silero_vad_ifless_folded"),
                    "onnxruntime gathers h and c from its float state input and quantises each on its own grid; "
                    "an NPU takes the state as one int8 tensor (h on c's ~28x wider grid: 15.6 dB). With every op "
                    "int8 onnxruntime's MinMax gives 12.05 dB, as npubuild's MinMax does since the Concat rule "
                    "keeps the decoder's h on its own grid (11.76 dB before). Spread: bootstrap over the 250 "
                    "windows (5-95%) +-1.5-2 dB per figure. VAD agreement run recurrently: npubuild's five range "
                    "estimators, with and without feedback, and onnxruntime's three methods span 96.4-98.4% "
                    "(one window is 0.4 points)"),
})
ORT_METHODS = ("MinMax", "Percentile", "Entropy")
Outputs = dict[str, np.ndarray]
Runner = Callable[[dict[str, np.ndarray]], Outputs]


# --------------------------------------------------------------------------- cache


def sha(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            h.update(file_sha(p).encode())
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


_FILE_SHA: dict[Path, str] = {}


def file_sha(p: Path) -> str:
    if p not in _FILE_SHA:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        _FILE_SHA[p] = h.hexdigest()
    return _FILE_SHA[p]


class Cache:
    """npz files under DIR/.bench/cache named by the hash of their inputs (atomic writes)."""

    def __init__(self, root: Path, fresh: bool):
        self.root, self.fresh = root, fresh
        root.mkdir(parents=True, exist_ok=True)

    def get(self, kind: str, key: str, compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        path = self.root / f"{kind}-{key}.npz"
        if path.is_file() and not self.fresh:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        arrays = compute()
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
        return arrays


def pack(outs: Outputs, prefix: str = "") -> dict[str, np.ndarray]:
    """Output dict -> npz-safe keys (ONNX names hold '/' and ':'), order kept."""
    return {f"{prefix}{i}": v for i, v in enumerate(outs.values())} | {f"{prefix}names": np.array(list(outs))}


def unpack(z: dict[str, np.ndarray], prefix: str = "") -> Outputs:
    names = [str(n) for n in z[f"{prefix}names"]]
    return {n: z[f"{prefix}{i}"] for i, n in enumerate(names)}


# --------------------------------------------------------------------------- measures


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    from npubuild.verify.numerics import snr_db as snr

    return snr(ref, got)


def run_samples(runner: Runner, feeds: dict[str, np.ndarray], recurrent: bool) -> Outputs:
    """The runner on every sample, stacked; recurrent (silero): its own `stateN` fed back as `state`, from zeros."""
    n = next(iter(feeds.values())).shape[0]
    outs: list[Outputs] = []
    state = None
    for i in range(n):
        feed = {k: v[i] for k, v in feeds.items()}
        if recurrent:
            feed["state"] = np.zeros_like(feed["state"]) if state is None else state.astype(np.float32)
        o = runner(feed)
        outs.append(o)
        if recurrent:
            state = np.asarray(o["stateN"], np.float32).reshape(feed["state"].shape)
    return {k: np.stack([np.asarray(o[k], np.float32) for o in outs]) for k in outs[0]}


def onnx_runner(path: Path, qdq_semantics: bool = False) -> Runner:
    from npubuild.tosa.run import OnnxSession

    sess = OnnxSession(path, qdq_semantics=qdq_semantics)
    return lambda feeds: sess(feeds)


def compare(flt: Outputs, got: Outputs, model: str) -> dict:
    """SNR per output and the lowest; the task metric."""
    per = {k: snr_db(flt[k], got[k]) for k in flt}
    res = {"snr_db": min(per.values()), "snr_per_output": per}
    task = real_tasks.TASKS.get(model)
    if task is not None:
        res["task"] = task.measure(flt, got)
    return res


# --------------------------------------------------------------------------- peers


def ort_quantize(model: Path, calib: dict[str, np.ndarray], method: str, out: Path) -> None:
    """onnxruntime's quantize_static as quant_check.py calls it, with one calibrate method."""
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self):
            n = next(iter(calib.values())).shape[0]
            self.it = iter([{k: v[i] for k, v in calib.items()} for i in range(n)])

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory(prefix="real-ort-") as d:
        src, pre = model, Path(d) / "pre.onnx"
        m = onnx.load(str(model))
        if next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")) < 13:  # per-channel DQ needs 13
            src = Path(d) / "op13.onnx"
            onnx.save(version_converter.convert_version(m, 13), str(src))
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        with contextlib.redirect_stdout(StringIO()):  # the calibrators print their progress
            quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, per_channel=True,
                            calibrate_method=getattr(CalibrationMethod, method))


def tflite_outputs(tf_python: str, original: Path, calib_npy: Path, eval_npy: Path, onnx_float: Outputs,
                   ) -> tuple[Outputs, Outputs] | str:
    """TFLite's float and int8 outputs on the eval inputs, named as the ONNX outputs (matched on the float
    outputs: the closest TFLite float output of the same size), or the reason there are none."""
    with tempfile.TemporaryDirectory(prefix="real-tfl-") as d:
        out = Path(d) / "out.npz"
        proc = subprocess.run([tf_python, str(HERE / "real_tflite.py"), str(original), str(calib_npy), str(eval_npy),
                               str(out)], capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if not out.is_file():
            return f"tflite helper failed (rc {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
        z = dict(np.load(out))
    if "error" in z:
        return str(z["error"])
    fnames, inames = [str(n) for n in z["float_names"]], [str(n) for n in z["int8_names"]]
    flt_t = {n: z[f"float_{i}"] for i, n in enumerate(fnames)}
    int_t = {n: z[f"int8_{i}"] for i, n in enumerate(inames)}
    mapping = {}
    for name, ref in onnx_float.items():
        cands = [(float(np.abs(v.reshape(ref.shape) - ref).max()), n) for n, v in flt_t.items()
                 if v.size == ref.size and n not in mapping.values()]
        if not cands:
            return f"no TFLite output matches ONNX output '{name}'"
        mapping[name] = min(cands)[1]
    return ({k: flt_t[v].reshape(onnx_float[k].shape) for k, v in mapping.items()},
            {k: int_t[v].reshape(onnx_float[k].shape) for k, v in mapping.items()})


# --------------------------------------------------------------------------- npubuild


def write_specs(real: Path, names: list[str], targets: tuple[str, ...] = TARGETS) -> list[Path]:
    """DIR/.bench-specs/<name>.yaml: DIR/specs/<name>.yaml for the two targets, with the evaluation inputs as its
    `evaluate:` set. A sibling of specs/: the parent's relative paths (../onnx, ../calib) resolve from the
    extending file."""
    spec_dir = real / ".bench-specs"
    spec_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for n in names:
        p = spec_dir / f"{n}.yaml"
        rel = os.path.relpath(real / "specs" / f"{n}.yaml", spec_dir)
        ev = next(e for e in (real / "eval" / f"{n}.npz", real / "eval" / f"{n}.npy") if e.is_file())
        # a model run recurrently declares its fed-back state, as its application would (frontend/qdq_feedback.py)
        feedback = "    feedback: {stateN: state}\n" if real_tasks.TASKS[n].recurrent else ""
        text = (f"version: 1\nextends: {rel}\nname: {n}\ntargets: [{', '.join(targets)}]\n"
                "# the build verifies against float on 4 evaluation inputs (held out; every calibration row\n"
                "# calibrates, as for the peers); evaluate: snr runs the deployable on them too\n"
                f"models:\n  {n}:\n    evaluate: {{inputs: {os.path.relpath(ev, spec_dir)}, metric: snr, samples: 4}}\n"
                + feedback)
        if not p.is_file() or p.read_text() != text:
            p.write_text(text)
        paths.append(p)
    return paths


def npubuild_build(specs: list[Path], build_dir: Path, jobs: int) -> dict:
    cmd = [sys.executable, "-m", "npubuild", "build", *map(str, specs), "--build-dir", str(build_dir), "-n", str(jobs),
           "--keep-going", "-q"]
    t0 = time.time()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run(["nice", "-n", "10", *cmd], capture_output=True, text=True, env=env)  # this tree's npubuild
    print(f"npubuild build: exit {proc.returncode} in {time.time() - t0:.0f} s", file=sys.stderr)
    if proc.returncode not in (0, 1):
        print(proc.stderr[-2000:], file=sys.stderr)
    return json.loads((build_dir / "report.json").read_text())


def vela_summary(entry: dict) -> Path | None:
    """The build's vela stage summary.json (its deployable beside it), None where Vela wrote nothing."""
    vela = entry["artifacts"].get("vela")
    return Path(vela).parent / "summary.json" if vela else None


def deployable(entry: dict) -> list[Path]:
    """The files the deployed run reads: the deployable .tflite (or, without one, the Vela artifacts)."""
    d = vela_summary(entry)
    if d is None:
        return []
    found = sorted(d.parent.glob("firmware/npubuild_deployable.tflite"))
    return found or sorted(d.parent.glob("**/*_vela.*"))


def deployed_outputs(entry: dict, feeds: dict[str, np.ndarray], recurrent: bool) -> tuple[Outputs, Outputs, str]:
    """(dequantized outputs, raw outputs, engine) of a build's deployment on the eval inputs: the deployable on
    the virtual device, as the build's evaluate: runs it (npubuild/verify/deployed.py)."""
    from npubuild.config.accelerator import Accelerator
    from npubuild.records.lower import LowerRecord
    from npubuild.verify.deployed import Deployed

    io_path = Path(entry["artifacts"]["io"])
    io = LowerRecord.read(io_path)
    fam = Accelerator.parse(entry["accelerator"]).lowering_family
    model = Deployed(io_path.parent, io, fam, vela_summary(entry))
    specs = {s.onnx_name: s for s in model.outputs}
    raw: list[Outputs] = []

    def deq(feed):
        r = model(feed)
        raw.append(r)
        return {k: specs[k].dequantize(v, np.float32) for k, v in r.items()}

    got = run_samples(deq, feeds, recurrent)
    raws = {k: np.stack([np.asarray(r[k]) for r in raw]) for k in raw[0]}
    return got, raws, model.engine


def deployed_specs(entry: dict, engine: str) -> list:
    """How the deployed outputs are quantised: the deployable's output specs where the virtual device ran it,
    else the TOSA graph's (io.json), as verify/deployed.Deployed gives them."""
    from npubuild.records.iospec import specs_from_json
    from npubuild.records.lower import LowerRecord
    from npubuild.records.vela import VelaRecord
    from npubuild.verify.deployed import VIRTUAL_DEVICE

    summary = vela_summary(entry)
    if engine == VIRTUAL_DEVICE and summary is not None:
        return list(specs_from_json(VelaRecord.read(summary).metrics["deployable"]["outputs"]))
    return list(LowerRecord.read(Path(entry["artifacts"]["io"])).outputs)


def lsb_vs_qdq(specs: list, qdq: Outputs, raw: Outputs) -> dict[str, dict[str, float]]:
    """Per quantized output, the deployed graph's error against the QDQ model in the output's LSB: the largest,
    the mean, and the fraction of elements more than 1 LSB off (drift shows there before the max moves)."""
    out = {}
    for s in specs:
        if s.quantized:
            e = s.lsb_error(qdq[s.onnx_name], raw[s.onnx_name])
            out[s.onnx_name] = {"max": float(e.max()), "mean": float(e.mean()), "over_1": float(np.mean(e > 1))}
    return out


def collapse_on_eval(entry: dict, specs: list, flt: Outputs, raw: Outputs, qdq: Outputs) -> dict:
    """The build's collapse rule (npubuild/records/accuracy.py, as its default gate applies it) on every
    evaluation input: per output its SNR, mean LSB error vs float, and whether it collapsed."""
    import onnx

    from npubuild.verify.accuracy import float_check, probability_outputs

    probs = probability_outputs(onnx.load(entry["artifacts"]["float"], load_external_data=False))
    check = float_check(specs, flt, raw, qdq, probs, "evaluation")
    return {k: {"snr_db": o.snr_db, "mean_error_lsb": o.mean_error_lsb, "probability": o.probability,
                "collapsed": o.collapsed} for k, o in check.outputs.items()}


# --------------------------------------------------------------------------- per model


def measure_model(name: str, real: Path, cache: Cache, report: dict, tf_python: str | None,
                  tflite_dir: Path | None, info: dict, targets: tuple[str, ...] = TARGETS, peers: bool = True) -> dict:
    import onnx
    import onnxruntime

    from npubuild.frontend.data import load_arrays

    t0 = time.time()
    task = real_tasks.TASKS[name]
    onnx_path = real / "onnx" / f"{name}.onnx"
    ev_path = next(p for p in (real / "eval" / f"{name}.npz", real / "eval" / f"{name}.npy") if p.is_file())
    cal_path = next(p for p in (real / "calib" / f"{name}.npz", real / "calib" / f"{name}.npy") if p.is_file())
    model = onnx.load(str(onnx_path), load_external_data=False)
    feeds = load_arrays(ev_path, model)
    calib = load_arrays(cal_path, model)
    versions = {"onnxruntime": onnxruntime.__version__, "measure": MEASURE_VERSION}
    peer_versions = {"onnxruntime": onnxruntime.__version__, "measure": PEER_VERSION}
    row: dict = {"model": name, "task": task.label, "lower_is_better": task.lower_is_better,
                 "samples": int(next(iter(feeds.values())).shape[0])}

    flt = unpack(cache.get("float", sha(onnx_path, ev_path, task.recurrent, peer_versions),
                           lambda: pack(run_samples(onnx_runner(onnx_path), feeds, task.recurrent))))
    # SNR and LSB: every sample with its own (float) state for silero; the task metric runs recurrently
    flt_each = flt if not task.recurrent else unpack(cache.get(
        "float", sha(onnx_path, ev_path, False, peer_versions), lambda: pack(run_samples(onnx_runner(onnx_path), feeds, False))))

    # npubuild, per target
    builds = {b["target"]: b for b in report.get("builds", []) if b["spec"] == name}
    row["npubuild"] = {}
    jobs = {}
    for target in targets:
        b = builds.get(target)
        if b is None:
            row["npubuild"][target] = {"error": "not built"}
            continue
        if "io" not in b.get("artifacts", {}) or b["stages"].get("vela", {}).get("status") != "passed":
            row["npubuild"][target] = {"error": (b.get("errors") or ["failed"])[0][:160]}  # nothing was deployed
            continue
        jobs[target] = b  # a build failed after Vela (npu-sim, a gate) is still measured: its cause is noted
    qdq_res = None
    for target, b in jobs.items():
        io_path, qdq_path = Path(b["artifacts"]["io"]), Path(b["artifacts"]["qdq"])
        qdq_each = unpack(cache.get("qdq", sha(qdq_path, ev_path, False, versions),
                                    lambda q=qdq_path: pack(run_samples(onnx_runner(q, True), feeds, False))))
        if qdq_res is None:
            qdq_res = compare(flt_each, qdq_each, name)
            if task.recurrent:
                qdq_rec = unpack(cache.get("qdq", sha(qdq_path, ev_path, True, versions),
                                           lambda q=qdq_path: pack(run_samples(onnx_runner(q, True), feeds, True))))
                qdq_res["task"] = task.measure(flt, qdq_rec)
            row["qdq"] = qdq_res
        arts = deployable(b)
        code = [file_sha(REPO / c) for c in DEPLOYED_CODE]
        # the per-window run's key and the recurrent run's differ: they were one key for Silero, so the recurrent
        # figure read back the per-window outputs (each window on the recorded float state, not its own fed
        # back) whenever the per-window run was cached first: the 92-94% "deployed" VAD agreement of 1eb8f46
        key = sha(io_path, *arts, ev_path, False, versions, code)
        t1 = time.time()

        def run_deployed(recurrent: bool, b=b) -> dict[str, np.ndarray]:
            got, raw, engine = deployed_outputs(b, feeds, recurrent)
            return {**pack(got), **pack(raw, "raw"), "engine": np.array(engine)}

        dep = cache.get("deployed", key, lambda: run_deployed(False))
        dep_each, raw_each = unpack(dep), unpack(dep, "raw")
        res = compare(flt_each, dep_each, name)
        res["engine"] = str(dep["engine"])
        specs = deployed_specs(b, res["engine"])
        res["lsb_vs_qdq"] = lsb_vs_qdq(specs, qdq_each, raw_each)
        res["max_lsb_vs_qdq"] = max((v["max"] for v in res["lsb_vs_qdq"].values()), default=None)
        if task.recurrent:
            key_r = sha(io_path, *arts, ev_path, "state fed back", versions, code)
            rec = unpack(cache.get("deployed", key_r, lambda: run_deployed(True)))
            res["task"] = task.measure(flt, rec)
        res["seconds"] = round(time.time() - t1, 1)
        res["collapse_eval"] = collapse_on_eval(b, specs, flt_each, raw_each, qdq_each)
        m = b["metrics"]
        res["build"] = {k: m.get(k) for k in ("collapsed_outputs", "float_snr_db", "qdq_float_snr_db", "float_engine",
                                              "float_samples", "float_samples_from", "eval_score", "eval_engine")}
        res["npu_offload"] = b["metrics"].get("npu_offload")
        res["status"], res["cause"] = b["status"], failure_cause(b)
        res["report_quant_snr_db"] = b["metrics"].get("quant_snr_db")
        row["npubuild"][target] = res

    # onnxruntime's quantize_static, three calibrate methods
    row["ort"] = {}
    for method in ORT_METHODS if peers else ():
        key = sha(onnx_path, cal_path, ev_path, method, peer_versions)

        def run_ort(method=method) -> dict[str, np.ndarray]:
            with tempfile.TemporaryDirectory(prefix="real-ort-") as d:
                q = Path(d) / "q.onnx"
                try:
                    ort_quantize(onnx_path, calib, method, q)
                    each = run_samples(onnx_runner(q), feeds, False)
                    rec = run_samples(onnx_runner(q), feeds, True) if task.recurrent else each
                except Exception as exc:  # noqa: BLE001 - the table says why there is no figure
                    return {"error": np.array(" ".join(f"{type(exc).__name__}: {exc}".split())[:200])}
            return {**pack(each), **pack(rec, "rec")}

        z = cache.get("ort", key, run_ort)
        if "error" in z:
            row["ort"][method] = {"error": str(z["error"])}
            continue
        res = compare(flt_each, unpack(z), name)
        if task.recurrent:
            res["task"] = task.measure(flt, unpack(z, "rec"))
        row["ort"][method] = res

    # what onnxruntime's model leaves in float (its placement does not depend on the calibration values)
    if peers:
        key = sha(onnx_path, "placement", peer_versions, file_sha(HERE / "ort_placement.py"))

        def run_placement() -> dict[str, np.ndarray]:
            from ort_placement import float_placement

            with tempfile.TemporaryDirectory(prefix="real-ort-") as d:
                q = Path(d) / "q.onnx"
                ort_quantize(onnx_path, {k: v[:2] for k, v in calib.items()}, "MinMax", q)
                p = float_placement(onnx.load(str(q)))
            return {"float_nodes": np.array(p.total_float), "describe": np.array(p.describe())}

        z = cache.get("ort-placement", key, run_placement)
        row["ort_placement"] = {"float_nodes": int(z["float_nodes"]), "describe": str(z["describe"])}

    # TFLite's int8 converter, where the model came as .tflite
    member = info.get(name, {}).get("member", "")
    if peers and info.get(name, {}).get("kind") == "tflite":
        original = tflite_dir / member if tflite_dir else None
        if tf_python is None or original is None or not original.is_file():
            row["tflite"] = {"error": "no --tf-python / --tflite-dir"}
        else:
            key = sha(original, cal_path, ev_path, file_sha(HERE / "real_tflite.py"), tf_python)

            def run_tfl() -> dict[str, np.ndarray]:
                got = tflite_outputs(tf_python, original, cal_path, ev_path, flt_each)
                if isinstance(got, str):
                    return {"error": np.array(got)}
                return {**pack(got[0], "float"), **pack(got[1], "int8")}

            z = cache.get("tflite", key, run_tfl)
            if "error" in z:
                row["tflite"] = {"error": str(z["error"])}
            else:
                tfl_float, tfl_int8 = unpack(z, "float"), unpack(z, "int8")
                res = compare(flt_each, tfl_int8, name)
                res["float_vs_onnx_snr_db"] = min(snr_db(flt_each[k], tfl_float[k]) for k in flt_each)
                row["tflite"] = res
    row["seconds"] = round(time.time() - t0, 1)
    return row


# --------------------------------------------------------------------------- table


def fmt_snr(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def fmt_task(res: dict | None, label: str) -> str:
    if not res or "task" not in res:
        return "—"
    t = res["task"]
    v = t.get("value")
    if v is None:
        return "n/a"
    if label in ("cosine",):
        text = f"{v:.3f}"
    elif label.endswith("px"):
        text = f"{v:.2f}"
    else:
        text = f"{100 * v:.1f}%"
    if "matched" in t:
        text += f" ({t['matched']}/{t['float_detections']})"
    if "kept" in t:
        text += f" ({t['kept']}/{t['float_fires']})"
    return text


def best(results: dict, key: Callable[[dict], float | None], lower: bool) -> dict | None:
    ok = [r for r in results.values() if "error" not in r and key(r) is not None]
    if not ok:
        return None
    return (min if lower else max)(ok, key=lambda r: key(r))


def verdict(d: dict) -> str:
    """A build's status and its collapsed outputs: as the build counted them (its 4 held-out samples) and as the
    same rule counts them on every evaluation input."""
    if "error" in d:
        return "failed"
    built = (d.get("build") or {}).get("collapsed_outputs")
    on_eval = sum(o["collapsed"] for o in (d.get("collapse_eval") or {}).values())
    return f"{d.get('status', '?')} ({'—' if built is None else built}, {on_eval})"


def table(rows: list[dict], tf_note: str) -> str:
    head = ("| model | task metric vs float | quant SNR dB (npubuild QDQ) | deployed SNR dB U55 / U85 | max LSB vs QDQ "
            "U55 / U85 | onnxruntime best SNR dB | TFLite int8 SNR dB | task: npubuild QDQ | task: deployed U55 / U85 "
            "| task: onnxruntime best | task: TFLite int8 | build U55 / U85 (collapsed outputs: build, rule on eval) |")
    lines = [head, "|" + "---|" * 12]
    notes = []
    for r in rows:
        name, label, lower = r["model"], r["task"], r["lower_is_better"]
        npb = r.get("npubuild", {})
        dep = [npb.get(t, {}) for t in TARGETS]
        dep_snr = " / ".join(fmt_snr(d.get("snr_db")) if "error" not in d else "failed" for d in dep)
        lsb = " / ".join("—" if "error" in d or d.get("max_lsb_vs_qdq") is None else f"{d['max_lsb_vs_qdq']:.0f}" for d in dep)
        dep_task = " / ".join(fmt_task(d, label) if "error" not in d else "failed" for d in dep)
        ort = r.get("ort", {})
        ort_snr = best(ort, lambda x: x.get("snr_db"), False)
        ort_task = best(ort, lambda x: (x.get("task") or {}).get("value"), lower)
        tfl = r.get("tflite")
        tfl_ok = tfl if tfl and "error" not in tfl else None
        ort_float = (r.get("ort_placement") or {}).get("float_nodes")
        verdicts = " / ".join(verdict(d) for d in dep)
        cells = [name, label + (" (lower better)" if lower else ""), fmt_snr((r.get("qdq") or {}).get("snr_db")), dep_snr,
                 lsb, (fmt_snr(ort_snr["snr_db"]) + (" (f)" if ort_float else "")) if ort_snr else "failed",
                 fmt_snr(tfl_ok["snr_db"]) if tfl_ok else ("—" if tfl is None else "failed"),
                 fmt_task(r.get("qdq"), label), dep_task, fmt_task(ort_task, label) if ort_task else "—",
                 fmt_task(tfl_ok, label) if tfl_ok else ("—" if tfl is None else "failed"), verdicts]
        lines.append("| " + " | ".join(cells) + " |")
        for t, d in zip(TARGETS, dep, strict=True):
            if "error" in d:
                notes.append(f"- {name} {t}: {d['error']}")
            elif d.get("status") == "failed":
                notes.append(f"- {name} {t}: measured, but npubuild's build failed: {d.get('cause')}")
            elif d.get("engine") != "virtual-device":
                notes.append(f"- {name} {t}: deployed outputs from {d.get('engine')} (no deployable the virtual "
                             "device runs)")
        for m, o in ort.items():
            if "error" in o:
                notes.append(f"- {name} onnxruntime {m}: {o['error']}")
        if ort_float:
            notes.append(f"- {name} onnxruntime (f): not all int8: {r['ort_placement']['describe']}")
        if tfl and "error" in tfl:
            notes.append(f"- {name} TFLite: {tfl['error']}")
    out = "\n".join(lines) + "\n"
    notes += [f"- {r['model']}: {NOTES[r['model']]}" for r in rows if r["model"] in NOTES]
    if notes:
        out += "\nNotes (a missing figure and why; (f): the peer's model is not all int8):\n\n" + "\n".join(notes) + "\n"
    out += ("\nPer output, SNR dB vs float: npubuild QDQ | deployed U55 | deployed U85 | onnxruntime MinMax / "
            "Percentile / Entropy | TFLite; then the deployed graphs' LSB error vs the QDQ model, U55 / U85: "
            "max, mean, % of elements more than 1 LSB off:\n\n")
    for r in rows:
        outs = list((r.get("qdq") or {}).get("snr_per_output") or {})
        for o in outs:
            def cell(x: dict | None, o: str = o) -> str:
                return fmt_snr(x.get("snr_per_output", {}).get(o)) if x and "error" not in x else "—"

            def lsb(x: dict | None, o: str = o) -> str:
                e = ((x or {}).get("lsb_vs_qdq") or {}).get(o)
                return f"{e['max']:.0f}, {e['mean']:.2f}, {100 * e['over_1']:.2f}%" if e else "—"

            ort, npb = r.get("ort", {}), r.get("npubuild", {})
            out += (f"- {r['model']} `{o}`: {cell(r.get('qdq'))} | {cell(npb.get(TARGETS[0]))} | "
                    f"{cell(npb.get(TARGETS[1]))} | {' / '.join(cell(ort.get(m)) for m in ORT_METHODS)} | "
                    f"{cell(r.get('tflite'))}; LSB {lsb(npb.get(TARGETS[0]))} / {lsb(npb.get(TARGETS[1]))}\n")
    return out + tf_note


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", type=Path, required=True, help="copy of ../shared/models/real with calib/ made")
    ap.add_argument("--work", type=Path, default=None, help="specs, build dir and cache (default REAL/.bench)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these models (default: all sixteen)")
    ap.add_argument("--tf-python", default=None, help="python with tensorflow-cpu (TFLite column)")
    ap.add_argument("--tflite-dir", type=Path, default=None, help="the .tflite originals as extracted from the wheels")
    ap.add_argument("--data-python", default=sys.executable, help="python with scikit-image (makes REAL/eval once)")
    ap.add_argument("-n", "--jobs", type=int, default=2, help="npubuild build -n (at most 2 on a shared machine)")
    ap.add_argument("--md", type=Path, default=HERE / "real_models.md")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    ap.add_argument("--no-build", action="store_true", help="measure the build dir as it is")
    ap.add_argument("--fresh", action="store_true", help="recompute everything the cache holds")
    ap.add_argument("--rev", default=None, help="the revision to name in the table (a run from an exported tree)")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS),
                    help="build and measure these targets only (the others keep their last rows)")
    ap.add_argument("--no-peers", action="store_true", help="keep the last onnxruntime/TFLite figures (npubuild only)")
    a = ap.parse_args()
    real = a.real.resolve()
    work = (a.work or real / ".bench").resolve()
    info = json.loads((real / "models.json").read_text())
    names = a.only or sorted(real_tasks.TASKS)
    unknown = [n for n in names if n not in real_tasks.TASKS]
    if unknown:
        ap.error(f"unknown model(s): {', '.join(unknown)}")
    if not (real / "eval" / "summary.json").is_file():
        subprocess.run([a.data_python, str(HERE / "real_eval_data.py"), "--real", str(real)], check=True)
    build_dir = work / "build"
    targets = tuple(t for t in TARGETS if t in a.targets)
    specs = write_specs(real, names, targets)
    report = json.loads((build_dir / "report.json").read_text()) if a.no_build else npubuild_build(specs, build_dir, a.jobs)
    cache = Cache(work / "cache", a.fresh)
    results_path = work / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for n in names:
        row = measure_model(n, real, cache, report, a.tf_python, a.tflite_dir, info, targets, not a.no_peers)
        old = results.get(n, {})
        row["npubuild"] = {**old.get("npubuild", {}), **row["npubuild"]}  # a target not rebuilt keeps its row
        if a.no_peers:
            row.update({k: old[k] for k in ("ort", "tflite", "ort_placement") if k in old})
        results[n] = row
        results_path.write_text(json.dumps(results, indent=1, default=float) + "\n")
        print(f"{n}: {row['seconds']} s", file=sys.stderr)
    rows = [results[n] for n in sorted(results)]
    rev = a.rev
    if rev is None:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() or "an exported tree"
        if subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD"], capture_output=True).returncode == 1:
            rev += " + local changes"
    text = ("# Real trained models: int8 accuracy against float (issue 30)\n\n"
            f"`python bench/real_models.py --real DIR --tf-python TFPY --tflite-dir RAW` (its docstring says what "
            f"each is) at {rev}; evaluation inputs from bench/real_eval_data.py (disjoint from the calibration). "
            "Deployed = the build's deployable .tflite on the virtual device (npu-sim runs each ethos-u operator's "
            "command stream, TensorFlow Lite Micro the host operators). "
            "SNR and LSB columns: the lowest output's; percentages are of the float model's decisions.\n\n"
            "The evaluation sets are small (13 float palm detections, 48 cls crops): how far each task figure moves "
            "between sets made the same way, and whether a difference is significant, is bench/real_spread.md.\n\n")
    text += table(rows, "")
    a.md.write_text(text)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1, default=float) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
