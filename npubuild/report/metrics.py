"""report stage (per build): gather the stages' metrics into the contract's metrics and check gates."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from npubuild.config.accelerator import Accelerator
from npubuild.config.gates import evaluate
from npubuild.config.metrics import METRICS
from npubuild.fileio import read_json, write_json
from npubuild.records.check import CheckRecord
from npubuild.records.npusim import NpuSimRecord
from npubuild.records.vela import VelaRecord
from npubuild.report.status import host_warning

FLOAT_METRICS = ("float_snr_db", "qdq_float_snr_db", "float_max_error_lsb", "float_mean_error_lsb",
                 "float_top1_agreement", "float_mask_iou", "float_decision_agreement", "collapsed_outputs",
                 "float_samples", "float_samples_from", "float_outputs", "float_engine")


def deployed_against_float(check: CheckRecord, sim: NpuSimRecord | None, family: str) -> dict:
    """What the target deploys against the float model (records/accuracy.py): the flat metrics, `float_outputs`
    per output and `float_engine`. The deployable as the npu-sim stage ran it (virtual-device); where that stage
    did not run it (no vela stage, npu-sim skipped or failed), the family's TOSA graph as tosa-check ran it
    (tosa-reference); None for each where neither measured (FP, no check)."""
    deployed, engine = (sim.float_check, "virtual-device") if sim is not None and sim.float_check else \
        (check.deployed_float(family), "tosa-reference")
    if deployed is None:
        return dict.fromkeys(FLOAT_METRICS)
    return {**deployed.summary(), "float_outputs": deployed.to_json()["outputs"], "float_engine": engine}


def build_metrics(records: Mapping[str, Mapping], accelerator: str) -> dict:
    """The contract's metrics (config.metrics.METRICS) from the stage records (None where a stage did not run)
    of a build for `accelerator`."""
    stage_metrics = {stage: rec.get("metrics", {}) for stage, rec in records.items()}
    lower, check = stage_metrics.get("lower", {}), CheckRecord.from_json(stage_metrics.get("tosa-check", {}))
    vela = VelaRecord.from_json(stage_metrics.get("vela", {}))
    sim_metrics = stage_metrics.get("npu-sim") or {}
    sim = NpuSimRecord.from_json(sim_metrics) if "samples" in sim_metrics or sim_metrics.get("skipped") else None
    family = Accelerator.parse(accelerator).lowering_family
    npu_ops = vela.npu_nodes if vela.npu_nodes is not None else lower.get("onnx_nodes", 0)  # nodes on the NPU
    cpu_ops = vela.vela_cpu_ops + (vela.host_ops or 0)
    total = npu_ops + cpu_ops
    derived = {"npu_ops": npu_ops, "cpu_ops": cpu_ops, "npu_offload": round(npu_ops / total, 4) if total else 0.0,
               # the error of the graph this target really runs against onnxruntime on the verify samples
               "deployed_max_error_lsb": check.deployed_error(family), **deployed_against_float(check, sim, family)}
    return {m.name: derived[m.name] if m.stage is None else stage_metrics.get(m.stage, {}).get(m.source_key)
            for m in METRICS}


def build_entry(records: Mapping[str, Path], accelerator: str, expect: Mapping[str, object], entry_out: Path,
                default_gates: tuple[str, ...] = (), warn_below_npu_offload: float | None = None) -> dict:
    """The report stage's work: the build's metrics from its stages' records (stage name -> stage.json), its
    gates checked against `expect` (`default_gates` only where measured: config/gates.py), and the warning that
    most of it runs on the host (below the pipeline's `warn_below_npu_offload`); entry.json (returned, the
    stage's metrics)."""
    metrics = build_metrics({stage: read_json(path) for stage, path in records.items()}, accelerator)
    gates = evaluate(dict(expect), metrics, default_gates)
    warning = host_warning(metrics, warn_below_npu_offload)
    entry = {"metrics": metrics, "gates": gates, "warnings": [warning] if warning else []}
    write_json(entry_out, entry)
    return entry
