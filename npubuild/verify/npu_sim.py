"""npu-sim stage: run the compiled artifact on npu-sim, require bit-exact agreement with TOSA, and measure what
is deployed against the float model.

The same sample inputs as tosa-check (frontend/samples.py: held back from calibration where the spec gives real
data), quantised with the graph's input parameters, go through the TOSA reference model and through npu-sim on
Vela's command stream and weights (the ethos-u operator of the .tflite, or the raw .npz). The reference is the
graph Vela compiled, or, for a sample where npu-sim gives model.tosa's outputs bit for bit (the graph tosa-check
checked, whose runs it kept: npusim.verify.compare), those: the target's own graph then runs only on a sample
that differs from what was checked. Any differing element
fails the build, naming the output, the count and the first NPU op writing a wrong value (npusim.verify.localise
traces the first TOSA result npu-sim does not reproduce). A graph split around host operators has each NPU
partition's artifact checked against its TOSA partition, and the build's deployable .tflite runs on the virtual
device (deploy/virtual_device.py: TensorFlow Lite Micro for the host operators) against the whole QDQ model.
U55, U65 and U85 artifacts run alike (npusim.sim.run picks the generation); a model with no NPU partition at
all (every node on the host) and features npu-sim does not model (npusim.NotModelled) are reported as skipped
with the reason. A command stream Vela got wrong (npusim.VelaMiscompile: e.g. a U55 elementwise IFM smaller
than its OFM) fails the build with what is wrong in it.

What the device computed on those samples (npu-sim's outputs of a whole-graph build, whose deployable is that one
ethos-u operator; the virtual device's of a split one) is measured against the float model and the QDQ model
(verify/accuracy.py): `float_check`, the build's figures against float (the report reads them from here, and
falls back to tosa-check's TOSA graph only where this stage did not run the deployable).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from npubuild.config.schema import Calibration
from npubuild.errors import InternalError, StageError
from npubuild.fileio import write_json
from npubuild.frontend.samples import SampleSource
from npubuild.npusim import NotModelled
from npubuild.npusim.npz import RawModel
from npubuild.npusim.tflite import load_tflite
from npubuild.npusim.tosa_probe import graph_io
from npubuild.npusim.verify import Verdict, compare, kept_outputs
from npubuild.records.accuracy import FloatCheck
from npubuild.records.build import Skip
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import LowerRecord, Where
from npubuild.records.npusim import NpuSimRecord
from npubuild.records.vela import VelaRecord
from npubuild.tosa.memo import RunMemo


@dataclass(frozen=True)
class SimFiles:
    """What the npu-sim stage reads: Vela's summary.json (the artifacts beside it), the lower stage's io.json
    (the TOSA graphs beside it), the float model and the data files tosa-check's samples come from."""

    vela_summary: Path
    io: Path
    float_model: Path
    calibration: Path | None = None
    eval_inputs: Path | None = None  # the evaluation set, where the samples come from it (frontend/samples.py)
    reference: Path | None = None  # the QDQ model, which the virtual device's output is held to
    runs: Path | None = None  # tosa-check's runs.npz: its runs on the same samples, not made again (tosa/memo.py)


@dataclass(frozen=True)
class SimSamples:
    """tosa-check's samples (frontend/samples.py: how many, their seed, from where), and the random range where
    there is no calibration file."""

    source: SampleSource
    calibration: Calibration


def simulate_build(files: SimFiles, draw: SimSamples, result_out: Path) -> dict:
    """The npu-sim stage's work: npusim.json, returned as the stage's metrics; a difference from the TOSA
    reference model fails it."""
    vela = VelaRecord.read(files.vela_summary)
    io = LowerRecord.read(files.io)
    if io.profile != "int":
        raise StageError("npu-sim needs an integer (int profile) TOSA graph")
    if vela.partition_graph and not any(p.kind == Where.NPU for p in vela.partition_graph):
        return _skip(result_out, "every node runs on the host (no NPU partition): there is no NPU artifact to simulate")
    if vela.vela_cpu_ops:
        return _skip(result_out, f"Vela left {vela.vela_cpu_ops} operators on the CPU inside an NPU partition; "
                     "npu-sim verifies what runs on the NPU only")
    float_model = onnx.load(str(files.float_model))
    arrays, samples_from = draw.source.verification(float_model, draw.calibration.model_dump(), files.calibration,
                                                    files.eval_inputs)
    feeds_of = [{k: v[i] for k, v in arrays.items()} for i in range(next(iter(arrays.values())).shape[0])]
    memo = RunMemo.read(files.runs)
    try:
        jobs = _jobs(files, draw, vela, io, feeds_of)
        checked = _checked_outputs(files.io.parent, io, vela.partitions[0].tosa, feeds_of, memo) \
            if len(jobs) == 1 and not jobs[0][0] else None
        results = [(label, compare(model, tosa, samples, names, memo, checked))
                   for label, model, tosa, samples, names in jobs]
    except NotModelled as exc:
        return _skip(result_out, f"the artifact uses what npu-sim does not model yet: {exc.message}")
    mismatches = {f"{label}{k}": {"elements": v, "of": r.elements[k]} for label, r in results
                  for k, v in r.mismatches.items()}
    bad = [(label, r) for label, r in results if not r.bitexact]
    if checked is not None and not bad:
        hold_exact_claim(io, vela.partitions[0].tosa, results[0][1])
    first = bad[0] if bad else None
    record = NpuSimRecord(
        None, results[0][1].samples, len(results), not bad, sum(r.npu_ops for _, r in results),
        round(sum(r.sim_seconds for _, r in results), 4), mismatches,
        first[1].first_bad_sample if first else None,
        f"{first[0]}{first[1].first_bad_op.describe()}" if first and first[1].first_bad_op else None)
    if not bad:
        if len(jobs) == 1 and len(vela.partition_graph) <= 1:  # the deployable is the artifact just run
            _, outputs = whole_graph_specs(io, vela.partitions[0].tosa)
            deployed = [{spec.onnx_name: spec.from_tosa(np.asarray(y).reshape(spec.shape))
                         for spec, y in zip(outputs, outs, strict=True)} for outs in results[0][1].outputs]
            record = replace(record, float_check=_float_check(files, float_model, outputs, feeds_of, deployed,
                                                              samples_from, memo))
        else:
            record = replace(record, **_device_check(files, float_model, vela, feeds_of, samples_from, memo))
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


def _jobs(files: SimFiles, draw: SimSamples, vela: VelaRecord, io: LowerRecord,
          feeds_of: list[dict[str, np.ndarray]]) -> list[tuple[str, object, bytes, list, list[str]]]:
    """(label, artifact, TOSA graph, integer samples, output names) per NPU partition (one for a whole graph).

    A whole graph runs tosa-check's samples (`feeds_of`); the NPU partitions of a split graph run seeded random
    integers over their inputs' full range (bit-exactness must hold for any input).
    """
    vela_dir, lower_dir = files.vela_summary.parent, files.io.parent
    if len(vela.partition_graph) <= 1:
        if not vela.partitions:
            raise StageError("the vela stage wrote no .tflite artifact")
        whole = vela.partitions[0]
        inputs, outputs = whole_graph_specs(io, whole.tosa)
        samples = [[spec.to_tosa(feeds[spec.onnx_name]) for spec in inputs] for feeds in feeds_of]
        tosa = lower_dir / whole.tosa
        return [("", _artifact(vela_dir / whole.tflite), tosa.read_bytes(), samples,
                 [o.onnx_name for o in outputs])]
    jobs = []
    rng = np.random.default_rng(draw.source.seed)
    for p in vela.partitions:
        tosa = (lower_dir / p.tosa).read_bytes()
        model = _artifact(vela_dir / p.tflite)
        inputs, outputs = graph_io(tosa)
        samples = [[rng.integers(np.iinfo(t).min, np.iinfo(t).max + 1, shape).astype(t) for _, shape, t in inputs]
                   for _ in range(draw.source.samples)]
        jobs.append((f"{p.stem}/", model, tosa, samples, outputs))
    return jobs


def _checked_outputs(lower_dir: Path, io: LowerRecord, tosa_file: str, feeds_of: list[dict[str, np.ndarray]],
                     memo: RunMemo) -> list[list[np.ndarray] | None] | None:
    """Per sample, model.tosa's outputs as tosa-check kept them (it checked that graph against the QDQ model,
    on every sample), laid out as the outputs of the graph Vela compiled (`tosa_file`: a family's own graph
    may take and give tensors in another layout, U65's planar image input); None where not kept. None for a
    portable split (no model.tosa) and where an output is held on another type or scale (integers alike
    would not mean values alike)."""
    path = lower_dir / "model.tosa"
    if io.portable is not None or not path.is_file():
        return None
    _, outputs = whole_graph_specs(io, tosa_file)
    if any((a.dtype, a.scale, a.zero_point) != (b.dtype, b.scale, b.zero_point)
           for a, b in zip(io.outputs, outputs, strict=True)):
        return None
    graph = path.read_bytes()
    checked: list[list[np.ndarray] | None] = []
    for feeds in feeds_of:
        kept = kept_outputs(memo, graph, [spec.to_tosa(feeds[spec.onnx_name]) for spec in io.inputs])
        checked.append(None if kept is None else [
            np.ascontiguousarray(np.transpose(own.from_tosa(y.reshape(own.shape)), target.perm))
            for own, target, y in zip(io.outputs, outputs, kept, strict=True)])
    return checked


def hold_exact_claim(io: LowerRecord, tosa_file: str, verdict: Verdict) -> None:
    """Raise an internal error where the lower stage found the compiled graph bit-identical to model.tosa
    (FamilyRecord.same_as_model_tosa, on one seeded random sample: ethosu/families.same_as_whole) and the
    deployable, which computes that graph exactly, gives other outputs than model.tosa's kept runs on a sample.
    The claim is what let tosa-check measure the family by model.tosa's error, so its figures would not hold;
    a form claimed exact that is not is npubuild's fault (mp_selfie_segmentation's U55/U65 whole-plane mean as
    a raw REDUCE_SUM rounded a tie below the zero point up: up to 41841 of 65536 mask pixels apart on its
    images, none on the random sample, issue 33). Checked here on every sample for no run at all: each is
    compared anyway (compare's `checked`)."""
    if not verdict.off_checked:
        return
    for fam, rec in io.families.items():
        if rec.same_as_model_tosa and rec.partitions and rec.partitions[0].file == tosa_file:
            raise InternalError(
                f"the lower stage found the {fam} graph ({tosa_file}) bit-identical to model.tosa, but it gives other "
                f"outputs on {len(verdict.off_checked)} of {verdict.samples} samples (first: sample "
                f"{verdict.off_checked[0]}): a form claimed exact is not, and tosa-check's figures for {fam} do not hold")


def whole_graph_specs(io: LowerRecord, tosa_file: str) -> tuple[Sequence[IOSpec], Sequence[IOSpec]]:
    """The inputs and outputs of the whole graph Vela compiled, laid out as that graph takes them: a family's
    own graph may take an input in another layout than model.tosa (U65's planar narrow image input), so the
    samples are laid out by its partition's specs, not the model's."""
    for family in io.families.values():
        for part in family.partitions:
            if part.file == tosa_file and part.inputs_io is not None and part.outputs_io is not None:
                return part.inputs_io, part.outputs_io
    return io.inputs, io.outputs


def _artifact(path: Path) -> RawModel:
    """The NPU artifact Vela wrote: the one ethos-u operator of its .tflite (what is deployed)."""
    models = load_tflite(path)
    if len(models) != 1:
        raise StageError(f"{path.name} holds {len(models)} ethos-u operators; Vela writes one per TOSA graph")
    return models[0]


def _device_check(files: SimFiles, float_model: onnx.ModelProto, vela: VelaRecord,
                  feeds_of: list[dict[str, np.ndarray]], samples_from: str, memo: RunMemo) -> dict:
    """A build with host partitions: its deployable .tflite on the virtual device (host operators in TensorFlow
    Lite Micro, ethos-u operators in npu-sim), on tosa-check's samples, against the whole QDQ model (the max
    LSB error) and against the float model (`float_check`). Nothing where there is no deployable (a host
    partition with no TFLite translation, on a Cortex-A target)."""
    from npubuild.deploy.virtual_device import OnDevice
    from npubuild.records.iospec import specs_from_json
    from npubuild.tosa.run import RememberedSession

    deployable = vela.metrics.get("deployable") or {}
    if not deployable.get("tflite") or files.reference is None:
        return {}
    stage_dir = files.vela_summary.parent
    device = OnDevice((stage_dir / deployable["tflite"]).read_bytes(), specs_from_json(deployable["inputs"]),
                      specs_from_json(deployable["outputs"]), deployable["tflite"])
    reference = RememberedSession(files.reference, memo)
    worst, deployed = 0.0, []
    for feeds in feeds_of:
        got, want = device(feeds), reference(dict(feeds))
        deployed.append(got)
        for spec in device.outputs:
            y = got[spec.onnx_name]
            worst = max(worst, float(spec.lsb_error(want[spec.onnx_name], y).max()) if spec.quantized
                        else float(np.abs(want[spec.onnx_name] - y).max()))
    return {"device_max_error_lsb": worst, "device_samples": len(feeds_of),
            "tflm_arena_bytes": device.device.host_arena_bytes,
            "float_check": _float_check(files, float_model, device.outputs, feeds_of, deployed, samples_from, memo)}


def _float_check(files: SimFiles, float_model: onnx.ModelProto, outputs, feeds_of: list[dict[str, np.ndarray]],
                 deployed: list[dict[str, np.ndarray]], samples_from: str, memo: RunMemo) -> FloatCheck | None:
    """What the device computed (raw outputs per sample, ONNX layout) against the float model, with the QDQ
    model's own figure beside it (verify/accuracy.py): both models' runs taken from tosa-check's where it made
    them (`memo`)."""
    from npubuild.tosa.run import RememberedSession
    from npubuild.verify.accuracy import float_check, probability_outputs, stacked

    if not feeds_of or files.reference is None:
        return None
    flt_session, qdq_session = RememberedSession(files.float_model, memo), RememberedSession(files.reference, memo)
    flt = stacked([flt_session(dict(f)) for f in feeds_of])
    qdq = stacked([qdq_session(dict(f)) for f in feeds_of])
    return float_check(outputs, flt, stacked(deployed), qdq, probability_outputs(float_model), samples_from,
                       len(feeds_of))
