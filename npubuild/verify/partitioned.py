"""Run a partitioned model: NPU partitions on the TOSA reference model, host partitions on onnxruntime.

Returns outputs in the same form as `tosa_run.run_tosa` on the one-graph TOSA
(raw integers for quantized outputs, in ONNX layout), so the TOSA check
compares a partitioned build with onnxruntime exactly as it does a whole one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npubuild.errors import StageError, one_line
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import LowerRecord, PartitionedCheck, PartitionRecord, Where
from npubuild.tosa.run import OnnxSession, run_tosa


class PartitionedModel:
    """A split model run partition by partition: NPU partitions on the TOSA reference model, host ones on
    onnxruntime (one session per host partition, kept across samples), float tensors passed between them."""

    def __init__(self, lower_dir: Path, partitions: Sequence[PartitionRecord], outputs: Sequence[IOSpec]):
        self.lower_dir, self.partitions, self.outputs = lower_dir, list(partitions), list(outputs)
        self._graphs: dict[str, bytes | OnnxSession] = {}

    def _graph(self, part: PartitionRecord) -> bytes | OnnxSession:
        if part.file not in self._graphs:
            path = self.lower_dir / part.file
            # a host partition runs as deployed: onnxruntime's own graph optimisation
            self._graphs[part.file] = OnnxSession(path, qdq_semantics=False) if part.kind == Where.HOST else path.read_bytes()
        return self._graphs[part.file]

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Outputs as the one-graph TOSA gives them (raw integers for quantized outputs, ONNX layout)."""
        env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in feeds.items()}
        for part in self.partitions:
            graph = self._graph(part)
            if isinstance(graph, OnnxSession):
                try:
                    env.update(graph({i: env[i] for i in part.inputs}))
                except Exception as exc:  # noqa: BLE001 - onnxruntime's run-time refusal, as one line
                    raise StageError(f"host partition {part.index} ({part.file}) failed on onnxruntime: "
                                     f"{one_line(str(exc), 320)}") from None
                continue
            io = part.io
            got = run_tosa(graph, io, {s.onnx_name: env[s.onnx_name] for s in io.inputs})
            for spec in io.outputs:  # float32, as the host partition's DequantizeLinear would give them
                y = got[spec.onnx_name]
                env[spec.onnx_name] = np.asarray(spec.dequantize(y, np.float32) if spec.quantized else y)
        return {s.onnx_name: s.quantize(env[s.onnx_name].astype(np.float64)) if s.quantized else env[s.onnx_name]
                for s in self.outputs}


def shape_mismatch(outputs: Sequence[IOSpec], got: dict[str, np.ndarray], ref: dict[str, np.ndarray],
                   what: str) -> str | None:
    """One line naming the first output whose shape differs from onnxruntime's, with both shapes, or None."""
    for spec in outputs:
        name = spec.onnx_name
        g, r = np.shape(got[name]), np.shape(ref[name])
        if g != r:
            return f"output '{name}': {what} gives shape {list(g)} where onnxruntime gives {list(r)}"
    return None


def max_error(spec: IOSpec, ref: np.ndarray, got: np.ndarray) -> float:
    """A partitioned model's error on one output against the QDQ model: LSB for an integer output (the
    reference on the output's grid, unsaturated), absolute for a float one."""
    if spec.scale is None:
        err = np.abs(got.astype(np.float64) - ref)
    else:
        err = np.abs(spec.quantize_reference(ref) - got.astype(np.float64))
    return float(err.max()) if err.size else 0.0


def worst_error(model: PartitionedModel, feeds: dict[str, np.ndarray], ref: dict[str, np.ndarray],
                worst: float = 0.0, got: dict[str, np.ndarray] | None = None) -> float:
    """`worst` raised to the partitioned model's largest error on any output of this sample (`got`: its
    outputs on `feeds`, when already run). A shape that differs from onnxruntime's fails the check."""
    got = model(feeds) if got is None else got
    outputs = model.outputs
    bad = shape_mismatch(outputs, got, ref, "the partitioned model")
    if bad:
        raise StageError(bad)
    for spec in outputs:
        worst = max(worst, max_error(spec, ref[spec.onnx_name], got[spec.onnx_name]))
    return worst


def bitexact_families(lower_dir: Path, io: LowerRecord) -> dict[str, PartitionedModel]:
    """The families the lower stage found bit-identical to model.tosa with a graph of their own: the TOSA check
    runs each on its first sample only (partitioned_numerics), a pure TOSA run it can make beside model.tosa's."""
    return {fam: PartitionedModel(lower_dir, rec.partitions, io.outputs) for fam, rec in io.families.items()
            if rec.same_as_model_tosa and not rec.runs_model_tosa}


def partitioned_numerics(lower_dir: Path, io: LowerRecord, samples: dict[str, np.ndarray],
                         reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
                         whole: WholeGraphCheck | None = None,
                         first_runs: dict[str, dict[str, np.ndarray]] | None = None,
                         outputs_of: dict[str, list[dict[str, np.ndarray]]] | None = None,
                         ) -> dict[str, PartitionedCheck]:
    """For every family that does not run model.tosa as is (split, or its own lowering): vs the QDQ model.

    `reference(feeds)` runs the QDQ model on onnxruntime. Returns family -> max error (output LSB) and samples.
    A family the lower stage found bit-identical to model.tosa (FamilyRecord.same_as_model_tosa: exact
    rewrites only) is run on the first sample and compared with `whole` (model.tosa's check) bit for bit:
    identical, its error over the samples is model.tosa's, measured by the same samples (3 fewer TOSA
    reference-model runs of 4; why one suffices: ethosu/families.same_as_whole); otherwise it is measured
    on every sample as a split family is. `first_runs`: such families' outputs on the first sample, when the
    caller has run them already. `outputs_of`, when given, receives each family's outputs on every sample
    (the families measured on every sample: a bit-identical one's are model.tosa's), for the check against
    the float model (verify/accuracy.py).
    """
    out = {}
    n = next(iter(samples.values())).shape[0] if samples else 0
    for fam, rec in io.families.items():
        if rec.runs_model_tosa:
            continue  # the family runs model.tosa itself, which the check above measured
        model = PartitionedModel(lower_dir, rec.partitions, io.outputs)
        if whole is not None and rec.same_as_model_tosa and n:
            got = (first_runs or {}).get(fam) or model({k: v[0] for k, v in samples.items()})
            if all(np.array_equal(got[k], v) for k, v in whole.first_outputs.items()):
                out[fam] = PartitionedCheck(whole.max_error_lsb, n, rec.npu_partitions, rec.host_partitions,
                                            bitexact_samples=1)
                continue
        worst = 0.0
        for i in range(n):
            feeds = {k: v[i] for k, v in samples.items()}
            got = model(feeds)
            worst = worst_error(model, feeds, reference(feeds), worst, got)
            if outputs_of is not None:
                outputs_of.setdefault(fam, []).append(got)
        out[fam] = PartitionedCheck(worst, n, rec.npu_partitions, rec.host_partitions)
    return out


@dataclass(frozen=True)
class WholeGraphCheck:
    """What the TOSA check measured of model.tosa: its raw outputs on the first sample and its max error
    over all the samples against the QDQ model, measured as worst_error measures a partitioned model."""

    first_outputs: dict[str, np.ndarray]
    max_error_lsb: float
