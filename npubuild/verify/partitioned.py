"""Run a partitioned model: NPU partitions on the TOSA reference model, host partitions on onnxruntime.

Returns outputs in the same form as `tosa_run.run_tosa` on the one-graph TOSA
(raw integers for quantized outputs, in ONNX layout), so the TOSA check
compares a partitioned build with onnxruntime exactly as it does a whole one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from npubuild.stages.records import LowerRecord, PartitionedCheck, PartitionRecord
from npubuild.tosa.iospec import IOSpec
from npubuild.tosa.run import run_onnx, run_tosa


def run_partitions(lower_dir: Path, partitions: Sequence[PartitionRecord], outputs: Sequence[IOSpec],
                   feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every partition in order, passing float tensors between them; outputs as the one-graph TOSA gives them."""
    env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in feeds.items()}
    for part in partitions:
        path = lower_dir / part.file
        if part.kind == "host":
            env.update(run_onnx(str(path), {i: env[i] for i in part.inputs}))
            continue
        io = part.io
        got = run_tosa(path.read_bytes(), io, {s.onnx_name: env[s.onnx_name] for s in io.inputs})
        for spec in io.outputs:  # float32, as the host partition's DequantizeLinear would give them
            y = got[spec.onnx_name]
            env[spec.onnx_name] = spec.dequantize(y, np.float32) if spec.quantized else y
    return {s.onnx_name: s.quantize(env[s.onnx_name].astype(np.float64)) if s.quantized else env[s.onnx_name]
            for s in outputs}


def max_error(spec: IOSpec, ref: np.ndarray, got: np.ndarray) -> float:
    """A partitioned model's error on one output against the QDQ model: LSB for an integer output (the
    reference on the output's grid, unsaturated), absolute for a float one."""
    if spec.scale is None:
        err = np.abs(got.astype(np.float64) - ref)
    else:
        err = np.abs(spec.quantize_reference(ref) - got.astype(np.float64))
    return float(err.max()) if err.size else 0.0


def worst_error(lower_dir: Path, partitions: Sequence[PartitionRecord], outputs: Sequence[IOSpec],
                feeds: dict[str, np.ndarray], ref: dict[str, np.ndarray], worst: float = 0.0) -> float:
    """`worst` raised to the partitioned model's largest error on any output of this sample."""
    got = run_partitions(lower_dir, partitions, outputs, feeds)
    for spec in outputs:
        worst = max(worst, max_error(spec, ref[spec.onnx_name], got[spec.onnx_name]))
    return worst


def partitioned_numerics(lower_dir: Path, io: LowerRecord, samples: dict[str, np.ndarray],
                         reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
                         ) -> dict[str, PartitionedCheck]:
    """For every family that does not run model.tosa as is (split, or its own lowering): vs the QDQ model.

    `reference(feeds)` runs the QDQ model on onnxruntime. Returns family -> max error (output LSB) and samples.
    """
    out = {}
    n = next(iter(samples.values())).shape[0] if samples else 0
    for fam, rec in io.families.items():
        if rec.runs_model_tosa:
            continue  # the family runs model.tosa itself, which the check above measured
        worst = 0.0
        for i in range(n):
            feeds = {k: v[i] for k, v in samples.items()}
            worst = worst_error(lower_dir, rec.partitions, io.outputs, feeds, reference(feeds), worst)
        out[fam] = PartitionedCheck(worst, n, rec.npu_partitions, rec.host_partitions)
    return out
