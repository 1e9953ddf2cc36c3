"""report stage (per build): gather the stages' metrics into the contract's metrics and check gates."""

from __future__ import annotations

from npubuild.build.plan import StageTask
from npubuild.ethosu.support import family
from npubuild.fileio import read_json, write_json
from npubuild.report.gates import evaluate
from npubuild.stages.records import PartitionedCheck


def deployed_error(check: dict, vela: dict) -> float | None:
    """Max LSB error of the graph this target really runs (its family's partitions or own lowering, else
    model.tosa) against onnxruntime on the verify samples."""
    fam = family(str(vela.get("accelerator", "ethos-u55")))
    own = (check.get("partitioned") or {}).get(fam)
    return PartitionedCheck.from_json(own).max_error_lsb if own else check.get("tosa_max_error_lsb")


def build_metrics(records: dict[str, dict]) -> dict:
    """The contract's metrics from the stage records (None where a stage did not run)."""
    lower = records.get("lower", {}).get("metrics", {})
    check = records.get("tosa-check", {}).get("metrics", {})
    vela = records.get("vela", {}).get("metrics", {})
    npu_ops = vela.get("npu_nodes", lower.get("onnx_nodes", 0))  # ONNX nodes placed on the NPU
    cpu_ops = vela.get("vela_cpu_ops", 0) + vela.get("host_ops", 0)
    total = npu_ops + cpu_ops
    return {
        "npu_ops": npu_ops,
        "cpu_ops": cpu_ops,
        "npu_offload": round(npu_ops / total, 4) if total else 0.0,
        "sram_kib": vela.get("sram_kib"),
        "offchip_kib": vela.get("offchip_kib"),
        "inference_ms": vela.get("inference_ms"),
        "npu_cycles": vela.get("npu_cycles"),
        "macs": vela.get("macs"),
        "tosa_max_error_lsb": check.get("tosa_max_error_lsb"),
        "tosa_snr_db": check.get("tosa_snr_db"),
        "quant_snr_db": check.get("quant_snr_db"),
        "fvp_npu_cycles": records.get("fvp", {}).get("metrics", {}).get("fvp_npu_cycles"),
        "fvp_vs_vela_cycles": records.get("fvp", {}).get("metrics", {}).get("fvp_vs_vela_cycles"),
        "fvp_max_error_lsb": records.get("fvp", {}).get("metrics", {}).get("fvp_max_error_lsb"),
        "npusim_bitexact": records.get("npu-sim", {}).get("metrics", {}).get("bitexact"),
        "tosa_mean_error_lsb": check.get("tosa_mean_error_lsb"),
        "tosa_cosine": check.get("tosa_cosine"),
        "accuracy": check.get("accuracy"),
        "float_accuracy": check.get("float_accuracy"),
        "accuracy_drop": check.get("accuracy_drop"),
        "outputs": check.get("outputs"),
        "io": check.get("io"),
        "tosa_ops": lower.get("tosa_op_count"),
        "transposes": lower.get("transposes"),
        "vela_npu_ops": vela.get("vela_npu_ops"),
        "vela_cpu_ops": vela.get("vela_cpu_ops"),
        "memory_mode": vela.get("memory_mode"),
        "pools": vela.get("pools"),
        "npu_partitions": vela.get("npu_partitions"),
        "host_ops": vela.get("host_ops"),
        "offloads": vela.get("offloads"),
        "partition_graph": vela.get("partition_graph"),
        "memory": vela.get("memory"),
        "layers": vela.get("layers"),
        "top_layers": vela.get("top_layers"),
        "firmware": vela.get("firmware"),
        "deployment": vela.get("deployment"),
        "deployed_max_error_lsb": deployed_error(check, vela),
    }


def run(task: StageTask) -> dict:
    records = {stage: read_json(path) for stage, path in task.inputs.items()}
    metrics = build_metrics(records)
    gates = evaluate(task.config["expect"], metrics)
    entry = {"metrics": metrics, "gates": gates}
    write_json(task.outputs["entry"], entry)
    return entry
