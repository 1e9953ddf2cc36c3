"""npu-sim stage: run the compiled raw artifact on npu-sim and require bit-exact agreement with TOSA.

The same sample inputs as tosa-check, quantised with the graph's input
parameters, go through the TOSA reference model and through npu-sim on
Vela's command stream and weights. Any differing element fails the build,
naming the output, the count and the first NPU op whose OFM matches no TOSA
intermediate. U85 and tflite-format builds are skipped with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.data import sample_arrays
from npubuild.errors import StageError
from npubuild.fileio import read_json, write_json
from npubuild.npusim import NotModelled
from npubuild.npusim.npz import load_raw
from npubuild.npusim.verify import compare
from npubuild.plan import StageTask


def skip_reason(accelerator: str, output_format: str) -> str | None:
    if accelerator.startswith("ethos-u85"):
        return "npu-sim models the Ethos-U55/U65 command stream; Ethos-U85 is not supported yet"
    if output_format != "raw":
        return "Vela wrote tflite; npu-sim runs raw artifacts (set the target's vela.output_format: raw)"
    return None


def quantise(x: np.ndarray, spec: dict) -> np.ndarray:
    """ONNX-layout float sample -> the TOSA graph's integer input, as tosa_run does it."""
    x = np.transpose(np.asarray(x), spec["perm"])
    info = np.iinfo(np.dtype(spec["dtype"]))
    return np.clip(np.round(x / spec["scale"]) + spec["zero_point"], info.min, info.max).astype(spec["dtype"])


def run(task: StageTask) -> dict:
    reason = skip_reason(task.config["accelerator"], task.config["output_format"])
    if reason is not None:
        metrics = {"skipped": True, "reason": reason}
        write_json(task.outputs["result"], metrics)
        return metrics
    vela = read_json(task.inputs["vela"])
    npzs = [a for a in vela.get("artifacts", []) if a.endswith(".npz")]
    if not npzs:
        raise StageError("the vela stage wrote no raw .npz artifact")
    if vela.get("vela_cpu_ops") or (vela.get("npu_partitions") or 1) > 1:
        metrics = {"skipped": True, "reason": f"Vela split the graph ({vela.get('vela_cpu_ops', 0)} CPU operators, "
                   f"{vela.get('npu_partitions', 1)} NPU partitions); npu-sim verifies whole-NPU graphs only"}
        write_json(task.outputs["result"], metrics)
        return metrics
    model = load_raw(task.inputs["vela"].parent / npzs[0])
    io = read_json(task.inputs["io"])
    if io["profile"] != "int":
        raise StageError("npu-sim needs an integer (int profile) TOSA graph")
    verify = task.config["verify"]
    float_model = onnx.load(str(task.inputs["float"]))
    arrays = sample_arrays(float_model, task.config["calibration"], task.inputs.get("calibration"),
                           verify["samples"], verify["seed"])
    n = next(iter(arrays.values())).shape[0]
    samples = [[quantise(arrays[spec["onnx_name"]][i], spec) for spec in io["inputs"]] for i in range(n)]
    names = [o["onnx_name"] for o in io["outputs"]]
    try:
        verdict = compare(model, task.inputs["tosa"].read_bytes(), samples, names)
    except NotModelled as exc:
        metrics = {"skipped": True, "reason": f"the artifact uses what npu-sim does not model yet: {exc.message}"}
        write_json(task.outputs["result"], metrics)
        return metrics
    metrics = {
        "skipped": False,
        "samples": verdict.samples,
        "bitexact": verdict.bitexact,
        "npu_ops": verdict.npu_ops,
        "sim_seconds": round(verdict.sim_seconds, 4),
        "mismatches": {k: {"elements": v, "of": verdict.elements[k]} for k, v in verdict.mismatches.items()},
        "first_bad_sample": verdict.first_bad_sample,
        "first_bad_op": verdict.first_bad_op.describe() if verdict.first_bad_op else None,
    }
    write_json(task.outputs["result"], metrics)
    if not verdict.bitexact:
        bad = ", ".join(f"'{k}' {v}/{verdict.elements[k]}" for k, v in verdict.mismatches.items() if v)
        where = f"; first: {verdict.first_bad_op.describe()}" if verdict.first_bad_op else ""
        raise StageError(f"npu-sim differs from the TOSA reference model ({model.accelerator}): {bad} elements "
                         f"over {verdict.samples} samples{where}")
    return metrics
