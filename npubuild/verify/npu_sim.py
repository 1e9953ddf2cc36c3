"""npu-sim stage: run the compiled raw artifact on npu-sim and require bit-exact agreement with TOSA.

The same sample inputs as tosa-check, quantised with the graph's input
parameters, go through the TOSA reference model and through npu-sim on
Vela's command stream and weights. Any differing element fails the build,
naming the output, the count and the first NPU op writing a wrong value (npusim.verify.localise
traces the first TOSA result npu-sim does not reproduce). A graph split around host operators has each NPU partition's
artifact checked against its TOSA partition. U55, U65 and U85 artifacts run
alike (npusim.sim.run picks the generation); tflite-format builds, a model
with no NPU partition at all (every node on the host) and features npu-sim does not model (npusim.NotModelled) are reported as skipped
with the reason. A command stream Vela got wrong (npusim.VelaMiscompile: e.g. a U55 elementwise IFM smaller
than its OFM) fails the build with what is wrong in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from npubuild.config.schema import Calibration
from npubuild.errors import StageError
from npubuild.fileio import write_json
from npubuild.frontend.samples import SampleSource
from npubuild.npusim import NotModelled
from npubuild.npusim.npz import load_raw
from npubuild.npusim.tosa_probe import graph_io
from npubuild.npusim.verify import compare
from npubuild.records.build import Skip
from npubuild.records.lower import LowerRecord
from npubuild.records.npusim import NpuSimRecord
from npubuild.records.vela import VelaRecord


@dataclass(frozen=True)
class SimFiles:
    """What the npu-sim stage reads: Vela's summary.json (the artifacts beside it), the lower stage's io.json
    (the TOSA graphs beside it), the float model and the data files tosa-check's samples come from."""

    vela_summary: Path
    io: Path
    float_model: Path
    calibration: Path | None = None
    eval_inputs: Path | None = None


@dataclass(frozen=True)
class SimSamples:
    """tosa-check's samples (frontend/samples.py: how many, their seed, from where), and the random range where
    there is no calibration file."""

    source: SampleSource
    calibration: Calibration


def simulate_build(files: SimFiles, draw: SimSamples, result_out: Path) -> dict:
    """The npu-sim stage's work (planned for raw builds: stages/npu_sim.py says why not otherwise):
    npusim.json, returned as the stage's metrics; a difference from the TOSA reference model fails it."""
    vela = VelaRecord.read(files.vela_summary)
    io = LowerRecord.read(files.io)
    if io.profile != "int":
        raise StageError("npu-sim needs an integer (int profile) TOSA graph")
    if vela.partition_graph and not any(p.kind == "npu" for p in vela.partition_graph):
        return _skip(result_out, "every node runs on the host (no NPU partition): there is no NPU artifact to simulate")
    if vela.vela_cpu_ops:
        return _skip(result_out, f"Vela left {vela.vela_cpu_ops} operators on the CPU inside an NPU partition; "
                     "npu-sim verifies what runs on the NPU only")
    try:
        jobs = _jobs(files, draw, vela, io)
        results = [(label, compare(model, tosa, samples, names)) for label, model, tosa, samples, names in jobs]
    except NotModelled as exc:
        return _skip(result_out, f"the artifact uses what npu-sim does not model yet: {exc.message}")
    mismatches = {f"{label}{k}": {"elements": v, "of": r.elements[k]} for label, r in results
                  for k, v in r.mismatches.items()}
    bad = [(label, r) for label, r in results if not r.bitexact]
    first = bad[0] if bad else None
    record = NpuSimRecord(
        None, results[0][1].samples, len(results), not bad, sum(r.npu_ops for _, r in results),
        round(sum(r.sim_seconds for _, r in results), 4), mismatches,
        first[1].first_bad_sample if first else None,
        f"{first[0]}{first[1].first_bad_op.describe()}" if first and first[1].first_bad_op else None)
    metrics = record.to_json()
    write_json(result_out, metrics)
    if bad:
        text = ", ".join(f"'{k}' {m['elements']}/{m['of']}" for k, m in mismatches.items() if m["elements"])
        where = f"; first: {record.first_bad_op}" if record.first_bad_op else ""
        raise StageError(f"npu-sim differs from the TOSA reference model ({jobs[0][1].accelerator}): {text} "
                         f"elements over {record.samples} samples{where}")
    return metrics


def _skip(result_out: Path, reason: str) -> dict:
    metrics = Skip(reason).to_json()
    write_json(result_out, metrics)
    return metrics


def _jobs(files: SimFiles, draw: SimSamples, vela: VelaRecord,
          io: LowerRecord) -> list[tuple[str, object, bytes, list, list[str]]]:
    """(label, artifact, TOSA graph, integer samples, output names) per NPU partition (one for a whole graph).

    A whole graph runs tosa-check's samples; the NPU partitions of a split graph run seeded random
    integers over their inputs' full range (bit-exactness must hold for any input).
    """
    vela_dir, lower_dir = files.vela_summary.parent, files.io.parent
    if len(vela.partition_graph) <= 1:
        if not vela.partitions or vela.partitions[0].tflite is not None:
            raise StageError("the vela stage wrote no raw .npz artifact")
        whole = vela.partitions[0]
        float_model = onnx.load(str(files.float_model))
        arrays, _ = draw.source.verification(float_model, draw.calibration.model_dump(), files.calibration,
                                             files.eval_inputs)
        n = next(iter(arrays.values())).shape[0]
        samples = [[spec.to_tosa(arrays[spec.onnx_name][i]) for spec in io.inputs] for i in range(n)]
        tosa = lower_dir / whole.tosa
        return [("", load_raw(vela_dir / whole.npz), tosa.read_bytes(), samples, [o.onnx_name for o in io.outputs])]
    jobs = []
    rng = np.random.default_rng(draw.source.seed)
    for p in vela.partitions:
        tosa = (lower_dir / p.tosa).read_bytes()
        model = load_raw(vela_dir / p.npz)
        inputs, outputs = graph_io(tosa)
        samples = [[rng.integers(np.iinfo(t).min, np.iinfo(t).max + 1, shape).astype(t) for _, shape, t in inputs]
                   for _ in range(draw.source.samples)]
        jobs.append((f"{p.stem}/", model, tosa, samples, outputs))
    return jobs
