"""tosa-check stage: the TOSA reference model against onnxruntime on the same inputs.

INT profile: the integer TOSA graph against the QDQ model (error in LSB of the
output's quantisation) and against the float model (quantisation SNR).
FP profile: float TOSA against the float model (proves the lowering alone).
An output whose shape differs from onnxruntime's fails the check with one line; NaN and inf must sit where
onnxruntime has them (the rest is measured by value); bool and index outputs are measured in their own
units. Each node's own error (verify/node_errors: the node fed the QDQ model's own inputs, the comparison
that rounds where the hardware does) gives `tosa_node_max_error_lsb` and `tosa_worst_node`, measured where
the spec gates it (max_tosa_node_error_lsb) or a whole-graph gate falls short (numerics.json `node_check`
says which; the cuts are ~1.2 whole-graph runs a sample of the reference model's time); the output
with the largest error is `tosa_worst_output`. A model with nodes no lowering takes has no model.tosa: its portable split is run
instead, and its per-node check measures every node whose cut lowers (the others are listed unchecked).
The samples are held back from calibration where the spec gives real data (frontend/samples.py), and the
TOSA graph each family would deploy is measured against the float model on them (verify/accuracy.py:
`float_checks`): the build's figures against float where no deployable runs (the npu-sim stage measures the
deployable itself: verify/npu_sim.py). The TOSA outputs of the first sample are kept (reference.npz) so that later stages (the
FVP) compare against them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from npubuild.config.gates import evaluate as evaluate_gates
from npubuild.config.schema import Calibration
from npubuild.errors import StageError
from npubuild.fanout import fan_out
from npubuild.fileio import atomic_path, write_json
from npubuild.frontend.samples import SampleSource
from npubuild.records.accuracy import FloatChecks
from npubuild.records.check import Checked, CheckRecord
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import LowerRecord, Where
from npubuild.tosa.memo import RunMemo
from npubuild.tosa.run import (
    REFERENCE_MODEL_PER_ONNXRUNTIME,
    RememberedSession,
    recording,
    run_tosa,
    timed_runs,
)
from npubuild.verify.accuracy import float_check, probability_outputs, stacked
from npubuild.verify.node_errors import NodeCheck, NodeErrors, prepare_node_check
from npubuild.verify.numerics import compare_output
from npubuild.verify.partitioned import (
    PartitionedModel,
    WholeGraphCheck,
    bitexact_families,
    max_error,
    partitioned_numerics,
    shape_mismatch,
)


def io_summary(io: LowerRecord) -> dict:
    """Graph inputs/outputs as deployed: dtype, ONNX-layout shape, scale and zero point (nobody has to guess)."""
    def one(spec: IOSpec) -> dict:
        return {"name": spec.onnx_name, "dtype": spec.dtype, "shape": list(spec.shape),
                "onnx_shape": list(spec.onnx_shape), "layout": spec.layout, "scale": spec.scale,
                "zero_point": spec.zero_point}
    return {"inputs": [one(s) for s in io.inputs], "outputs": [one(s) for s in io.outputs]}


GraphRunner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def graph_runner(io: LowerRecord, lower_dir: Path) -> GraphRunner:
    """What the check runs: model.tosa on the TOSA reference model, or, for a model with nodes no lowering
    takes (no model.tosa), its portable split (NPU partitions on the reference model, host ones on
    onnxruntime). Either gives ONNX-layout outputs, raw integers for quantized ones."""
    if io.portable is not None:
        return PartitionedModel(lower_dir, io.portable.partitions, io.outputs)
    tosa = (lower_dir / "model.tosa").read_bytes()
    return lambda feeds: run_tosa(tosa, io, feeds)


@dataclass(frozen=True)
class CheckFiles:
    """What the check reads: the lower stage's io.json (the graphs beside it), the model it is held to (the QDQ
    model; the float one for an FP pipeline), the float model, and the user's data files."""

    io: Path
    reference: Path
    float_model: Path
    calibration: Path | None = None
    eval_inputs: Path | None = None  # the evaluation set's inputs, where the samples come from it


@dataclass(frozen=True)
class CheckOptions:
    """How the check samples (frontend/samples.py: how many, from where) and cuts the model."""

    samples: SampleSource
    calibration: Calibration  # the random samples' range where there is no calibration file
    passes: tuple[str, ...] = ()  # the pipeline's: the per-node check cuts the model as the lower stage sees it
    # when the per-node cuts run (stages/tosa_check.node_check_policy): None is always, as a gated spec
    node_check: Mapping[str, Any] | None = None


def check_tosa(files: CheckFiles, options: CheckOptions, numerics_out: Path, reference_out: Path | None,
               runs_out: Path | None = None) -> dict:
    """The tosa-check stage's work: numerics.json (returned, the stage's metrics) and, with `reference_out`,
    the first sample's inputs and TOSA outputs (reference.npz, which the FVP stage compares against); with
    `runs_out`, the whole-graph runs it made (runs.npz, tosa/memo.py: what the npu-sim stage would run again)."""
    io = LowerRecord.read(files.io)
    lower_dir = files.io.parent
    runner = graph_runner(io, lower_dir)
    what = "the TOSA graph" if io.whole_graph else "the partitioned model"
    is_int = io.profile == "int"
    float_model = onnx.load(str(files.float_model))
    samples, samples_from = options.samples.verification(float_model, options.calibration.model_dump(),
                                                         files.calibration, files.eval_inputs)
    n = next(iter(samples.values())).shape[0]
    memo = RunMemo()  # each run once: a split family's QDQ reference on a sample is the whole graph's
    reference, flt_runner = RememberedSession(files.reference, memo), RememberedSession(files.float_model, memo)
    names = [o.onnx_name for o in io.outputs]
    got: dict[str, list] = {k: [] for k in names}
    ref: dict[str, list] = {k: [] for k in names}
    flt: dict[str, list] = {k: [] for k in names}
    lsb: dict[str, list] = {k: [] for k in names}
    first_raw: dict[str, np.ndarray] = {}
    per_sample: list[tuple[dict, dict, dict]] = []  # (raw graph outputs, float's, QDQ's) for the float check
    partitioned_error = 0.0  # model.tosa's error as the partitioned check measures it (WholeGraphCheck)
    feeds_of = [{k: v[i] for k, v in samples.items()} for i in range(n)]
    refs, onnxruntime_s = timed_runs(reference, feeds_of)
    policy = options.node_check if options.node_check is not None else {"gated": True}

    def node_check() -> NodeCheck:  # a split model's nodes too: each cut is lowered and run on its own
        return prepare_node_check(onnx.load(str(files.reference)), list(options.passes), samples)

    families = bitexact_families(lower_dir, io) if is_int and io.whole_graph and n else {}
    # a gated per-node check runs in the same map as the whole graphs (the workers stay busy); else it waits
    # for the whole-graph figures and runs only where a whole-graph gate falls short
    runs = reference_model_runs(runner, feeds_of, io.whole_graph, families,
                                node_check() if is_int and policy.get("gated") else None, onnxruntime_s)
    memo.update(runs.memo)
    for i, feeds in enumerate(feeds_of):
        r, f, t = refs[i], flt_runner(feeds), runs.samples[i]
        bad = shape_mismatch(io.outputs, t, r, what)
        if bad:
            raise StageError(bad)
        per_sample.append((t, f, r))
        for spec in io.outputs:
            name = spec.onnx_name
            if i == 0:
                first_raw[name] = t[name]
            got[name].append(np.atleast_1d(spec.dequantize(t[name])))
            ref[name].append(np.atleast_1d(r[name]))
            flt[name].append(np.atleast_1d(f[name]))
            if is_int:
                lsb[name].append(output_lsb_error(spec, r[name], t[name]).ravel())
                partitioned_error = max(partitioned_error, max_error(spec, r[name], t[name]))
    for name in names:  # an If the host runs whole may return a shape the data decides: compare element by element
        if len({r.shape for r in ref[name]}) > 1:
            for rows in (ref, got, flt, lsb):
                rows[name] = [r.ravel() for r in rows[name]]
    per_output = {
        name: compare_output(np.concatenate(ref[name]), np.concatenate(got[name]),
                             np.concatenate(flt[name]) if is_int else None,
                             np.concatenate(lsb[name]) if is_int else None)
        for name in names
    }
    unmatched = [f"'{k}' {e['nonfinite_mismatches']}" for k, e in per_output.items() if e.get("nonfinite_mismatches")]
    if unmatched:
        raise StageError(f"NaN/inf where onnxruntime has none, or the other way round ({what}): "
                         f"{', '.join(unmatched)} elements of {n} samples")
    record = CheckRecord(
        n, io.profile, min(e["snr_db"] for e in per_output.values()),
        max(e["max_error_lsb"] for e in per_output.values()) if is_int else None,
        min(e["quant_snr_db"] for e in per_output.values()) if is_int else None,
        tosa_mean_error_lsb=max(e["mean_error_lsb"] for e in per_output.values()) if is_int else None,
        tosa_worst_output=max(per_output, key=lambda k: per_output[k]["max_error_lsb"]) if is_int else None,
        tosa_cosine=min(e["cosine"] for e in per_output.values()), outputs=per_output, io=io_summary(io),
        checked=None if io.whole_graph else Checked.PARTITIONED)
    nodes, why = runs.nodes, None
    if nodes is None and is_int:
        short = [g["name"] for g in evaluate_gates(policy.get("whole_graph_expect") or {}, record.to_json())
                 if not g["ok"]]
        why = f"run: {', '.join(short)} fell short" if short else \
            "not run: no max_tosa_node_error_lsb gate and every whole-graph gate held"
        if short:
            check = node_check()
            nodes = check.run_all(NODE_CHECK_RUNS * n * REFERENCE_MODEL_PER_ONNXRUNTIME * onnxruntime_s)
    elif is_int:
        why = "run: max_tosa_node_error_lsb gates it"
    if io.portable is not None and not any(p.kind == Where.NPU for p in io.portable.partitions):
        # the host runs every node: onnxruntime was compared with itself, nothing of TOSA: no figure, not 200 dB
        record = replace(record, checked=Checked.HOST_ONLY, tosa_snr_db=None, tosa_max_error_lsb=None,
                         tosa_mean_error_lsb=None, tosa_worst_output=None, tosa_cosine=None)
    if is_int and not _quantizes(files.reference):
        record = replace(record, quant_snr_db=None)  # no Q/DQ node in the reference: the float model compared with itself
    checks = None
    if is_int:  # split builds (a family that cannot run some node): the partitioned model, same samples
        whole = WholeGraphCheck(first_raw, partitioned_error) if io.whole_graph else None
        family_outputs: dict[str, list[dict[str, np.ndarray]]] = {}
        checks = partitioned_numerics(lower_dir, io, samples, reference, whole, runs.first_runs, family_outputs)
        record = replace(record, float_checks=against_float(io, float_model, per_sample, family_outputs, samples_from))
    record = replace(record, node_check=why, node_errors=nodes.to_json() if nodes is not None else None,
                     partitioned=checks)
    summary = record.to_json()
    write_json(numerics_out, summary)
    if reference_out is not None:
        with atomic_path(reference_out) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **{f"input_{k}": v[0] for k, v in samples.items()},
                     **{f"output_{k}": v for k, v in first_raw.items()})
    if runs_out is not None:
        memo.write(runs_out)
    return summary


def _quantizes(qdq_model: Path) -> bool:
    """Whether the QDQ reference quantizes anything (a model the host runs whole keeps no Q/DQ pair)."""
    return any(n.op_type == "QuantizeLinear" for n in onnx.load(str(qdq_model), load_external_data=False).graph.node)


NODE_CHECK_RUNS = 1.2  # the per-node check's reference-model time, in whole-graph runs per sample (measured)


@dataclass(frozen=True)
class ReferenceRuns:
    """What the TOSA reference model gave the check: the graph's outputs per sample, the bit-identical families'
    outputs on the first sample, and the per-node check (None where there is none); `memo`, the whole graphs'
    runs by key (tosa/memo.py)."""

    samples: list[dict[str, np.ndarray]]
    first_runs: dict[str, dict[str, np.ndarray]]
    nodes: NodeErrors | None
    memo: RunMemo = field(default_factory=RunMemo)


def reference_model_runs(runner: GraphRunner, feeds_of: list[dict[str, np.ndarray]], whole_graph: bool,
                         families: dict[str, PartitionedModel], node_check: NodeCheck | None,
                         onnxruntime_s: float) -> ReferenceRuns:
    """Every reference-model run of the check, made at once: model.tosa on each sample, each family the lower
    stage found bit-identical to it (`families`) on the first (partitioned_numerics), and the per-node cuts,
    in that order, over worker processes (npubuild/fanout.py) when onnxruntime's time on the QDQ model
    (`onnxruntime_s` a sample) says they are worth it. An error is the first run's in that order, as the runs one by one give
    it. A portable split runs host partitions on onnxruntime, whose threads a fork does not carry: here, and
    its per-node cuts (pure TOSA work) after it, over the workers."""
    if not whole_graph:
        samples = [runner(feeds) for feeds in feeds_of]
        if node_check is None:
            return ReferenceRuns(samples, {}, None)
        expected_s = NODE_CHECK_RUNS * len(feeds_of) * REFERENCE_MODEL_PER_ONNXRUNTIME * onnxruntime_s
        return ReferenceRuns(samples, {}, node_check.run_all(expected_s))
    graphs = [*(partial(runner, feeds) for feeds in feeds_of), *(partial(m, feeds_of[0]) for m in families.values())]
    cuts = len(node_check.cuts) if node_check is not None else 0

    def run(i: int):
        if i >= len(graphs):
            return node_check.check(i - len(graphs))  # type: ignore[union-attr]
        with recording() as kept:  # a whole graph's run: kept for the npu-sim stage (it comes back from a worker)
            return graphs[i](), kept

    whole_runs = len(graphs) + (NODE_CHECK_RUNS * len(feeds_of) if node_check is not None else 0)
    done = fan_out(run, len(graphs) + cuts, whole_runs * REFERENCE_MODEL_PER_ONNXRUNTIME * onnxruntime_s)
    n = len(feeds_of)
    memo = RunMemo()
    for _, kept in done[:len(graphs)]:
        memo.update(kept)
    outputs = [got for got, _ in done[:len(graphs)]]
    return ReferenceRuns(outputs[:n], dict(zip(families, outputs[n:], strict=True)),
                         node_check.collect(done[len(graphs):]) if node_check is not None else None, memo)


def output_lsb_error(spec: IOSpec, ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """|error| in LSB of one output: of its quantisation, or, for an output on no scale (bool, indices, a
    float the host computes), in units of its own values (a flipped bool, an index one off: 1)."""
    if spec.quantized:
        return spec.lsb_error(ref, got)
    r, g = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    both = np.isfinite(r) & np.isfinite(g)
    return np.where(both, np.abs(r - g), 0.0)


def against_float(io: LowerRecord, float_model: onnx.ModelProto, per_sample: list[tuple[dict, dict, dict]],
                  family_outputs: dict[str, list[dict[str, np.ndarray]]], samples_from: str) -> FloatChecks:
    """The checked graph and every family measured on all samples, against the float model (verify/accuracy)."""
    probs = probability_outputs(float_model)
    raw, flt, qdq = (stacked([s[k] for s in per_sample]) for k in range(3))
    n = len(per_sample)
    graph = float_check(io.outputs, flt, raw, qdq, probs, samples_from, n)
    return FloatChecks(graph, {fam: float_check(io.outputs, flt, stacked(outs), qdq, probs, samples_from, n)
                               for fam, outs in family_outputs.items()})
