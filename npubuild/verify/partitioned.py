"""Run a partitioned model: NPU partitions on the TOSA reference model, host partitions on onnxruntime.

Returns outputs in the same form as `tosa_run.run_tosa` on the one-graph TOSA
(raw integers for quantized outputs, in ONNX layout), so the TOSA check
compares a partitioned build with onnxruntime exactly as it does a whole one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npubuild.tosa.run import run_onnx, run_tosa


def _dequantize(y: np.ndarray, spec: dict) -> np.ndarray:
    if spec["dtype"] in ("float32", "bool") or spec.get("scale") is None:
        return y
    return ((y.astype(np.float64) - spec["zero_point"]) * spec["scale"]).astype(np.float32)


def _quantize(y: np.ndarray, spec: dict) -> np.ndarray:
    if spec["dtype"] in ("float32", "bool") or spec.get("scale") is None:
        return y
    info = np.iinfo(np.dtype(spec["dtype"]))
    q = np.clip(np.round(y.astype(np.float64) / spec["scale"]) + spec["zero_point"], info.min, info.max)
    return q.astype(spec["dtype"])


def run_partitions(lower_dir: Path, partitions: list[dict], outputs: list[dict],
                   feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every partition in order, passing float tensors between them; outputs as the one-graph TOSA gives them."""
    env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in feeds.items()}
    for part in partitions:
        path = lower_dir / part["file"]
        if part["kind"] == "host":
            env.update(run_onnx(str(path), {i: env[i] for i in part["inputs"]}))
            continue
        io = {"profile": part["profile"], "inputs": part["inputs_io"], "outputs": part["outputs_io"]}
        got = run_tosa(path.read_bytes(), io, {s["onnx_name"]: env[s["onnx_name"]] for s in part["inputs_io"]})
        for spec in part["outputs_io"]:
            env[spec["onnx_name"]] = _dequantize(got[spec["onnx_name"]], spec)
    return {spec["onnx_name"]: _quantize(env[spec["onnx_name"]], spec) for spec in outputs}


def partitioned_numerics(lower_dir: Path, io: dict, samples: dict[str, np.ndarray], reference) -> dict:
    """For every family that does not run model.tosa as is (split, or its own lowering): vs the QDQ model.

    `reference(feeds)` runs the QDQ model on onnxruntime. Returns family -> max error (output LSB) and samples.
    """
    out = {}
    n = next(iter(samples.values())).shape[0] if samples else 0
    for fam, rec in (io.get("families") or {}).items():
        if len(rec["partitions"]) < 2 and rec["partitions"][0]["file"] == "model.tosa":
            continue  # the family runs model.tosa itself, which the check above measured
        worst = 0.0
        for i in range(n):
            feeds = {k: v[i] for k, v in samples.items()}
            ref, got = reference(feeds), run_partitions(lower_dir, rec["partitions"], io["outputs"], feeds)
            for spec in io["outputs"]:
                name = spec["onnx_name"]
                if spec.get("scale") is None:
                    err = np.abs(got[name].astype(np.float64) - ref[name])
                else:
                    err = np.abs(np.round(ref[name] / spec["scale"]) + spec["zero_point"] - got[name].astype(np.float64))
                worst = max(worst, float(err.max()) if err.size else 0.0)
        out[fam] = {"max_error_lsb": worst, "samples": n, "npu_partitions": rec["npu_partitions"],
                    "host_partitions": rec["host_partitions"]}
    return out
