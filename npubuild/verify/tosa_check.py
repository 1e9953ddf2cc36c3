"""tosa-check stage: the TOSA reference model against onnxruntime on the same inputs.

INT profile: the integer TOSA graph against the QDQ model (error in LSB of the
output's quantisation) and against the float model (quantisation SNR).
FP profile: float TOSA against the float model (proves the lowering alone).
With an evaluation set, top-1 accuracy of the float model and of the TOSA
graph (what the NPU runs) on its labels. The TOSA outputs of the first sample
are kept (reference.npz) so that later stages (the FVP) compare against them.
"""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.build.plan import StageTask
from npubuild.errors import InputError
from npubuild.fileio import atomic_path, write_json
from npubuild.frontend.data import load_arrays, sample_arrays
from npubuild.stages.records import LowerRecord
from npubuild.tosa.iospec import IOSpec
from npubuild.tosa.run import OnnxSession, run_tosa
from npubuild.verify.numerics import accuracy, compare_output
from npubuild.verify.partitioned import partitioned_numerics


def io_summary(io: LowerRecord) -> dict:
    """Graph inputs/outputs as deployed: dtype, ONNX-layout shape, scale and zero point (nobody has to guess)."""
    def one(spec: IOSpec) -> dict:
        return {"name": spec.onnx_name, "dtype": spec.dtype, "shape": list(spec.shape),
                "onnx_shape": list(spec.onnx_shape), "layout": spec.layout, "scale": spec.scale,
                "zero_point": spec.zero_point}
    return {"inputs": [one(s) for s in io.inputs], "outputs": [one(s) for s in io.outputs]}


def run(task: StageTask) -> dict:
    io = LowerRecord.read(task.inputs["io"])
    tosa = task.inputs["tosa"].read_bytes()
    verify = task.config["verify"]
    is_int = io.profile == "int"
    float_model = onnx.load(str(task.inputs["float"]))
    samples = sample_arrays(float_model, task.config["calibration"], task.inputs.get("calibration"),
                            verify["samples"], verify["seed"])
    n = next(iter(samples.values())).shape[0]
    reference, flt_runner = OnnxSession(task.inputs["reference"]), OnnxSession(task.inputs["float"])
    names = [o.onnx_name for o in io.outputs]
    got: dict[str, list] = {k: [] for k in names}
    ref: dict[str, list] = {k: [] for k in names}
    flt: dict[str, list] = {k: [] for k in names}
    lsb: dict[str, list] = {k: [] for k in names}
    first_raw: dict[str, np.ndarray] = {}
    for i in range(n):
        feeds = {k: v[i] for k, v in samples.items()}
        r, f, t = reference(feeds), flt_runner(feeds), run_tosa(tosa, io, feeds)
        for spec in io.outputs:
            name = spec.onnx_name
            if i == 0:
                first_raw[name] = t[name]
            got[name].append(spec.dequantize(t[name]))
            ref[name].append(r[name])
            flt[name].append(f[name])
            if is_int:
                lsb[name].append(spec.lsb_error(r[name], t[name]).ravel())
    per_output = {
        name: compare_output(np.concatenate(ref[name]), np.concatenate(got[name]),
                             np.concatenate(flt[name]) if is_int else None,
                             np.concatenate(lsb[name]) if is_int else None)
        for name in names
    }
    summary: dict = {
        "samples": n,
        "profile": io.profile,
        "tosa_snr_db": min(e["snr_db"] for e in per_output.values()),
        "tosa_max_error_lsb": max(e["max_error_lsb"] for e in per_output.values()) if is_int else None,
        "tosa_mean_error_lsb": max(e["mean_error_lsb"] for e in per_output.values()) if is_int else None,
        "tosa_cosine": min(e["cosine"] for e in per_output.values()),
        "quant_snr_db": min(e["quant_snr_db"] for e in per_output.values()) if is_int else None,
        "outputs": per_output,
        "io": io_summary(io),
    }
    if is_int:  # split builds (a family that cannot run some node): the partitioned model, same samples
        checks = partitioned_numerics(task.inputs["tosa"].parent, io, samples, reference)
        summary["partitioned"] = {fam: c.to_json() for fam, c in checks.items()}
    if task.inputs.get("eval_inputs") is not None:
        summary.update(evaluate(task, io, tosa, float_model, flt_runner))
    write_json(task.outputs["numerics"], summary)
    if "reference" in task.outputs:
        with atomic_path(task.outputs["reference"]) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **{f"input_{k}": v[0] for k, v in samples.items()},
                     **{f"output_{k}": v for k, v in first_raw.items()})
    return summary


def evaluate(task: StageTask, io: LowerRecord, tosa: bytes, float_model: onnx.ModelProto, flt_runner: OnnxSession) -> dict:
    """Top-1 accuracy on the evaluation set: the float model, and the TOSA graph the NPU will run."""
    cfg = task.config["evaluation"]
    inputs = load_arrays(task.inputs["eval_inputs"], float_model)
    try:
        labels = np.load(task.inputs["eval_labels"], allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load labels: {exc}", str(task.inputs["eval_labels"])) from None
    n = next(iter(inputs.values())).shape[0]
    if labels.ndim != 1 or labels.shape[0] != n or not np.issubdtype(labels.dtype, np.integer):
        raise InputError(f"labels must be {n} integers (one per input sample), got {labels.dtype} "
                         f"{list(labels.shape)}", str(task.inputs["eval_labels"]))
    if cfg.get("samples"):
        n = min(n, cfg["samples"])
    names = [o.onnx_name for o in io.outputs]
    out = cfg.get("output") or names[0]
    if out not in names:
        raise InputError(f"evaluation output '{out}' is not a graph output (outputs: {', '.join(names)})")
    spec = io.outputs[names.index(out)]
    f_scores, t_scores = [], []
    for i in range(n):
        feeds = {k: v[i] for k, v in inputs.items()}
        f_scores.append(flt_runner(feeds)[out].reshape(-1))
        t_scores.append(spec.dequantize(run_tosa(tosa, io, feeds)[out]).reshape(-1))
    fa = accuracy(np.stack(f_scores), labels[:n])
    ta = accuracy(np.stack(t_scores), labels[:n])
    return {"eval_samples": n, "float_accuracy": fa, "accuracy": ta, "accuracy_drop": fa - ta}
