"""tosa-check stage: the TOSA reference model against onnxruntime on the same inputs.

INT profile: the integer TOSA graph against the QDQ model (error in LSB of the
output's quantisation) and against the float model (quantisation SNR).
FP profile: float TOSA against the float model (proves the lowering alone).
"""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.data import sample_arrays
from npubuild.fileio import read_json, write_json
from npubuild.numerics import cosine, snr_db, top1_agreement
from npubuild.plan import StageTask
from npubuild.tosa_run import run_onnx, run_tosa


def run(task: StageTask) -> dict:
    io = read_json(task.inputs["io"])
    tosa = task.inputs["tosa"].read_bytes()
    verify = task.config["verify"]
    float_model = onnx.load(str(task.inputs["float"]))
    samples = sample_arrays(float_model, task.config["calibration"], task.inputs.get("calibration"),
                            verify["samples"], verify["seed"])
    n = next(iter(samples.values())).shape[0]
    per_output: dict[str, dict] = {}
    collected: dict[str, dict[str, list]] = {o["onnx_name"]: {"ref": [], "tosa": [], "float": [], "lsb": []}
                                             for o in io["outputs"]}
    for i in range(n):
        feeds = {k: v[i] for k, v in samples.items()}
        ref = run_onnx(str(task.inputs["reference"]), feeds)
        flt = run_onnx(str(task.inputs["float"]), feeds)
        got = run_tosa(tosa, io, feeds)
        for spec in io["outputs"]:
            name = spec["onnx_name"]
            y = got[name]
            if spec["dtype"] == "float32":
                deq = y.astype(np.float64)
                lsb = None
            else:
                deq = (y.astype(np.float64) - spec["zero_point"]) * spec["scale"]
                ref_q = np.round(ref[name] / spec["scale"]) + spec["zero_point"]
                lsb = np.abs(ref_q - y.astype(np.float64))
            collected[name]["ref"].append(ref[name])
            collected[name]["tosa"].append(deq)
            collected[name]["float"].append(flt[name])
            if lsb is not None:
                collected[name]["lsb"].append(lsb)
    for name, c in collected.items():
        ref = np.concatenate(c["ref"])
        got = np.concatenate(c["tosa"])
        flt = np.concatenate(c["float"])
        entry = {
            "snr_db": snr_db(ref, got),
            "cosine": cosine(ref, got),
            "max_abs_error": float(np.max(np.abs(ref - got))),
            "quant_snr_db": snr_db(flt, got),
        }
        if c["lsb"]:
            lsb = np.concatenate([x.ravel() for x in c["lsb"]])
            entry["max_error_lsb"] = float(lsb.max())
            entry["mean_error_lsb"] = float(lsb.mean())
        t1 = top1_agreement(ref.reshape(ref.shape[0], -1) if ref.ndim > 2 else ref, got.reshape(got.shape[0], -1) if got.ndim > 2 else got)
        if t1 is not None and ref.ndim == 2:
            entry["top1_agreement"] = t1
        per_output[name] = entry
    summary = {
        "samples": n,
        "profile": io["profile"],
        "tosa_snr_db": min(e["snr_db"] for e in per_output.values()),
        "tosa_max_error_lsb": max((e.get("max_error_lsb", 0.0) for e in per_output.values()), default=0.0)
        if io["profile"] == "int" else None,
        "quant_snr_db": min(e["quant_snr_db"] for e in per_output.values()),
        "outputs": per_output,
    }
    write_json(task.outputs["numerics"], summary)
    return summary
