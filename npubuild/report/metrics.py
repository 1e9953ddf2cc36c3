"""report stage (per build): gather the stages' metrics into the contract's metrics and check gates."""

from __future__ import annotations

from npubuild.build.plan import StageTask
from npubuild.config.accelerator import Accelerator
from npubuild.config.metrics import METRICS
from npubuild.fileio import read_json, write_json
from npubuild.report.gates import evaluate
from npubuild.stages.records import PartitionedCheck


def deployed_error(check: dict, vela: dict) -> float | None:
    """Max LSB error of the graph this target really runs (its family's partitions or own lowering, else
    model.tosa) against onnxruntime on the verify samples."""
    fam = Accelerator.parse(str(vela.get("accelerator", "ethos-u55-128"))).lowering_family
    own = (check.get("partitioned") or {}).get(fam)
    return PartitionedCheck.from_json(own).max_error_lsb if own else check.get("tosa_max_error_lsb")


FLOAT_METRICS = ("float_snr_db", "qdq_float_snr_db", "float_max_error_lsb", "float_mean_error_lsb",
                 "float_top1_agreement", "float_mask_iou", "float_decision_agreement", "collapsed_outputs",
                 "float_samples", "float_samples_from")


def deployed_against_float(check: dict, vela: dict) -> dict:
    """The target's deployed graph against the float model (verify/accuracy.py): the flat metrics and
    `float_outputs` per output; None for each where the TOSA check measured nothing (FP, no check)."""
    if not check.get("float_checks"):
        return {k: None for k in (*FLOAT_METRICS, "float_outputs")}
    from npubuild.verify.accuracy import FloatChecks

    fam = Accelerator.parse(str(vela.get("accelerator", "ethos-u55-128"))).lowering_family
    deployed = FloatChecks.from_json(check["float_checks"]).for_family(fam)
    return {**deployed.summary(), "float_outputs": deployed.to_json()["outputs"]}


def build_metrics(records: dict[str, dict]) -> dict:
    """The contract's metrics (config.metrics.METRICS) from the stage records (None where a stage did not run)."""
    stage_metrics = {stage: rec.get("metrics", {}) for stage, rec in records.items()}
    lower, check, vela = (stage_metrics.get(s, {}) for s in ("lower", "tosa-check", "vela"))
    npu_ops = vela.get("npu_nodes", lower.get("onnx_nodes", 0))  # ONNX nodes placed on the NPU
    cpu_ops = vela.get("vela_cpu_ops", 0) + vela.get("host_ops", 0)
    total = npu_ops + cpu_ops
    derived = {"npu_ops": npu_ops, "cpu_ops": cpu_ops, "npu_offload": round(npu_ops / total, 4) if total else 0.0,
               "deployed_max_error_lsb": deployed_error(check, vela), **deployed_against_float(check, vela)}
    return {m.name: derived[m.name] if m.stage is None else stage_metrics.get(m.stage, {}).get(m.source_key)
            for m in METRICS}


def run(task: StageTask) -> dict:
    records = {stage: read_json(path) for stage, path in task.inputs.items()}
    metrics = build_metrics(records)
    gates = evaluate(task.config["expect"], metrics, task.config.get("default_gates", ()))
    entry = {"metrics": metrics, "gates": gates}
    write_json(task.outputs["entry"], entry)
    return entry
