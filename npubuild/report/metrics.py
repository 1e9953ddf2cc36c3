"""report stage (per build): gather the stages' metrics into the contract's metrics and check gates."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from npubuild.config.accelerator import Accelerator
from npubuild.config.gates import evaluate
from npubuild.config.metrics import METRICS
from npubuild.fileio import read_json, write_json
from npubuild.records.check import CheckRecord
from npubuild.records.vela import VelaRecord
from npubuild.report.status import host_warning


def build_metrics(records: Mapping[str, Mapping], accelerator: str) -> dict:
    """The contract's metrics (config.metrics.METRICS) from the stage records (None where a stage did not run)
    of a build for `accelerator`."""
    stage_metrics = {stage: rec.get("metrics", {}) for stage, rec in records.items()}
    lower, check = stage_metrics.get("lower", {}), CheckRecord.from_json(stage_metrics.get("tosa-check", {}))
    vela = VelaRecord.from_json(stage_metrics.get("vela", {}))
    npu_ops = vela.npu_nodes if vela.npu_nodes is not None else lower.get("onnx_nodes", 0)  # nodes on the NPU
    cpu_ops = vela.vela_cpu_ops + (vela.host_ops or 0)
    total = npu_ops + cpu_ops
    derived = {"npu_ops": npu_ops, "cpu_ops": cpu_ops, "npu_offload": round(npu_ops / total, 4) if total else 0.0,
               # the error of the graph this target really runs against onnxruntime on the verify samples
               "deployed_max_error_lsb": check.deployed_error(Accelerator.parse(accelerator).lowering_family)}
    return {m.name: derived[m.name] if m.stage is None else stage_metrics.get(m.stage, {}).get(m.source_key)
            for m in METRICS}


def build_entry(records: Mapping[str, Path], accelerator: str, expect: Mapping[str, object], entry_out: Path,
                warn_below_npu_offload: float | None = None) -> dict:
    """The report stage's work: the build's metrics from its stages' records (stage name -> stage.json), its
    gates checked against `expect`, and the warning that most of it runs on the host (below the pipeline's
    `warn_below_npu_offload`); entry.json (returned, the stage's metrics)."""
    metrics = build_metrics({stage: read_json(path) for stage, path in records.items()}, accelerator)
    gates = evaluate(dict(expect), metrics)
    warning = host_warning(metrics, warn_below_npu_offload)
    entry = {"metrics": metrics, "gates": gates, "warnings": [warning] if warning else []}
    write_json(entry_out, entry)
    return entry
