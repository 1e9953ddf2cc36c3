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

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from npubuild.config.schema import Calibration
from npubuild.errors import StageError
from npubuild.fileio import write_json
from npubuild.frontend.samples import SampleSource
from npubuild.npusim import NotModelled
from npubuild.npusim.npz import RawModel, load_raw
from npubuild.npusim.tflite import load_tflite
from npubuild.npusim.tosa_probe import graph_io
from npubuild.npusim.verify import compare
from npubuild.records.build import Skip
from npubuild.records.lower import LowerRecord, Where
from npubuild.records.npusim import NpuSimRecord
from npubuild.records.vela import VelaRecord


@dataclass(frozen=True)
class SimFiles:
    """What the npu-sim stage reads: Vela's summary.json (the artifacts beside it), the lower stage's io.json
    (the TOSA graphs beside it), the float model and the calibration file (tosa-check's samples)."""

    vela_summary: Path
    io: Path
    float_model: Path
    calibration: Path | None = None
    reference: Path | None = None  # the QDQ model, which the virtual device's output is held to


def simulate_build(files: SimFiles, draw: SampleSource, calibration: Calibration, result_out: Path) -> dict:
    """The npu-sim stage's work (planned for raw builds: stages/npu_sim.py says why not otherwise):
    npusim.json, returned as the stage's metrics; a difference from the TOSA reference model fails it."""
    vela = VelaRecord.read(files.vela_summary)
    io = LowerRecord.read(files.io)
    if io.profile != "int":
        raise StageError("npu-sim needs an integer (int profile) TOSA graph")
    if vela.partition_graph and not any(p.kind == Where.NPU for p in vela.partition_graph):
        return _skip(result_out, "every node runs on the host (no NPU partition): there is no NPU artifact to simulate")
    if vela.vela_cpu_ops:
        return _skip(result_out, f"Vela left {vela.vela_cpu_ops} operators on the CPU inside an NPU partition; "
                     "npu-sim verifies what runs on the NPU only")
    try:
        jobs = _jobs(files, draw, calibration, vela, io)
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
    if not bad:
        record = replace(record, **_device_check(files, draw, calibration, vela))
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


def _jobs(files: SimFiles, draw: SampleSource, calibration: Calibration, vela: VelaRecord,
          io: LowerRecord) -> list[tuple[str, object, bytes, list, list[str]]]:
    """(label, artifact, TOSA graph, integer samples, output names) per NPU partition (one for a whole graph).

    A whole graph runs tosa-check's samples; the NPU partitions of a split graph run seeded random
    integers over their inputs' full range (bit-exactness must hold for any input).
    """
    vela_dir, lower_dir = files.vela_summary.parent, files.io.parent
    if len(vela.partition_graph) <= 1:
        if not vela.partitions:
            raise StageError("the vela stage wrote no .tflite or raw .npz artifact")
        whole = vela.partitions[0]
        float_model = onnx.load(str(files.float_model))
        arrays = draw.verification(float_model, calibration.model_dump(), files.calibration)
        n = next(iter(arrays.values())).shape[0]
        samples = [[spec.to_tosa(arrays[spec.onnx_name][i]) for spec in io.inputs] for i in range(n)]
        tosa = lower_dir / whole.tosa
        return [("", _artifact(vela_dir / (whole.tflite or whole.npz)), tosa.read_bytes(), samples,
                 [o.onnx_name for o in io.outputs])]
    jobs = []
    rng = np.random.default_rng(draw.seed)
    for p in vela.partitions:
        tosa = (lower_dir / p.tosa).read_bytes()
        model = _artifact(vela_dir / (p.tflite or p.npz))
        inputs, outputs = graph_io(tosa)
        samples = [[rng.integers(np.iinfo(t).min, np.iinfo(t).max + 1, shape).astype(t) for _, shape, t in inputs]
                   for _ in range(draw.samples)]
        jobs.append((f"{p.stem}/", model, tosa, samples, outputs))
    return jobs


def _artifact(path: Path) -> RawModel:
    """The NPU artifact Vela wrote: the one ethos-u operator of its .tflite (what is deployed), or a raw .npz."""
    if path.suffix == ".npz":
        return load_raw(path)
    models = load_tflite(path)
    if len(models) != 1:
        raise StageError(f"{path.name} holds {len(models)} ethos-u operators; Vela writes one per TOSA graph")
    return models[0]


def _device_check(files: SimFiles, draw: SampleSource, calibration: Calibration, vela: VelaRecord) -> dict:
    """A build with host partitions: its deployable .tflite on the virtual device (host operators in TensorFlow
    Lite Micro, ethos-u operators in npu-sim), on tosa-check's samples, against the whole QDQ model; the max
    LSB error. A whole-graph build's deployable is the artifact checked above."""
    from npubuild.deploy.virtual_device import VirtualDevice
    from npubuild.records.iospec import specs_from_json
    from npubuild.tosa.run import OnnxSession

    deployable = vela.metrics.get("deployable") or {}
    if not deployable or files.reference is None or not any(p.kind == Where.HOST for p in vela.partition_graph):
        return {}
    stage_dir = files.vela_summary.parent
    device = VirtualDevice((stage_dir / deployable["tflite"]).read_bytes(), deployable["tflite"])
    ins, outs = specs_from_json(deployable["inputs"]), specs_from_json(deployable["outputs"])
    arrays = draw.verification(onnx.load(str(files.float_model)), calibration.model_dump(), files.calibration)
    reference = OnnxSession(files.reference)
    worst, n = 0.0, next(iter(arrays.values())).shape[0]
    for i in range(n):
        feeds = {s.onnx_name: arrays[s.onnx_name][i] for s in ins}
        got = device.run([s.to_tosa(feeds[s.onnx_name]) if s.quantized else  # a bool or index input as it is
                          np.transpose(np.asarray(feeds[s.onnx_name]), s.perm).astype(s.dtype) for s in ins])
        want = reference(dict(feeds))
        for spec, y in zip(outs, got, strict=True):
            y = spec.from_tosa(np.asarray(y).reshape(spec.shape))
            worst = max(worst, float(spec.lsb_error(want[spec.onnx_name], y).max()) if spec.quantized
                        else float(np.abs(want[spec.onnx_name] - y).max()))
    return {"device_max_error_lsb": worst, "device_samples": n, "tflm_arena_bytes": device.host_arena_bytes}
