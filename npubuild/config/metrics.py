"""The report's metrics and the spec's gates, in one table each: where every metric comes from, and which
`expect:` key checks it how. schema.Expect is made from GATES, report.json's metrics from METRICS.

Names here are part of the contract (report.json, `expect:`, regressions.yaml): add freely, rename none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Metric:
    """One entry of a build's `metrics` in report.json: the `key` of the `stage`'s own metrics (None: derived
    from several stages by the report stage)."""

    name: str
    stage: str | None
    key: str | None = None

    @property
    def source_key(self) -> str:
        return self.key or self.name


def _m(stage: str | None, *names: str) -> tuple[Metric, ...]:
    return tuple(Metric(n, stage) for n in names)


METRICS: tuple[Metric, ...] = (
    *_m(None, "npu_ops", "cpu_ops", "npu_offload"),
    *_m("vela", "sram_kib", "offchip_kib", "inference_ms", "npu_cycles", "macs"),
    *_m("tosa-check", "tosa_max_error_lsb", "tosa_snr_db", "quant_snr_db"),
    *_m("fvp", "fvp_npu_cycles", "fvp_vs_vela_cycles", "fvp_max_error_lsb"),
    Metric("npusim_bitexact", "npu-sim", "bitexact"),
    *_m("tosa-check", "tosa_mean_error_lsb", "tosa_cosine"),
    *_m("evaluate", "accuracy", "float_accuracy", "accuracy_drop"),  # metric top1 (or the older `evaluation:`)
    *_m("tosa-check", "outputs", "io"),
    Metric("tosa_ops", "lower", "tosa_op_count"),
    Metric("quantization", "quantize"),  # the recipe the quantize stage chose and each candidate's SNR vs float
    Metric("precision", "precision"),  # int16 groups and int4 layers, fixed or chosen (frontend/precision/)
    Metric("transposes", "lower"),
    *_m("vela", "vela_npu_ops", "vela_cpu_ops", "memory_mode", "pools", "npu_partitions", "host_ops", "host_macs",
        "offloads", "partition_graph", "memory", "layers", "top_layers", "firmware", "deployment"),
    # roofline (ethosu/perf.roofline): sum over Vela's layers of max(MAC-bound, memory-bound) time, and that
    # bound over Vela's estimated inference time
    *_m("vela", "bound_ms", "efficiency", "roofline"),
    Metric("deployed_max_error_lsb", None),
    # each node fed the QDQ model's own inputs (verify/node_errors): the lowering's own error, not the
    # float32 reference's rounding noise grown through the layers after it; the worst node and output by name
    *_m("tosa-check", "tosa_node_max_error_lsb", "tosa_worst_node", "tosa_worst_output"),
    # what this target deploys against the float model on held-back samples (verify/accuracy.py,
    # frontend/samples.py): the worst output for each measure, each output's, and what ran it (float_engine:
    # virtual-device, the deployable in the npu-sim stage; tosa-reference, the TOSA graph where none ran)
    *_m(None, "float_snr_db", "qdq_float_snr_db", "float_max_error_lsb", "float_mean_error_lsb",
        "float_top1_agreement", "float_mask_iou", "float_decision_agreement", "collapsed_outputs", "float_samples",
        "float_samples_from", "float_outputs", "float_engine"),
    # the spec's `evaluate:` on the deployed graph (verify/evaluate.py): the metric, its value for the deployed
    # graph, the QDQ model and the float model (where the metric is not a comparison with float), and the drop
    *_m("evaluate", "eval_metric", "eval_score", "eval_qdq_score", "eval_float_score", "eval_drop", "eval_samples",
        "eval_engine"),
    # the deployable (deploy/): whether a Cortex-M host runs all of it, TFLite Micro's arena for its host
    # operators (beside the NPU arena, sram_kib), and the virtual device's output against the QDQ model
    *_m("vela", "cortex_m_deployable", "tflm_arena_bytes"),
    *_m("npu-sim", "device_max_error_lsb"),
)


@dataclass(frozen=True)
class Gate:
    """An `expect:` key: `metric` must be >= (min), <= (max) or == (eq) the limit the spec gives."""

    key: str
    metric: str
    compare: Literal["min", "max", "eq"]
    type: type = float
    bounds: dict[str, float] = field(default_factory=dict)  # pydantic Field bounds on the limit (ge, gt, le)
    description: str = ""


GATES: tuple[Gate, ...] = (
    Gate("npu_offload", "npu_offload", "min", float, {"ge": 0, "le": 1}, "Minimum fraction of ops on the NPU"),
    Gate("max_cpu_ops", "cpu_ops", "max", int, {"ge": 0}),
    Gate("max_sram_kib", "sram_kib", "max", float, {"gt": 0}),
    Gate("max_offchip_kib", "offchip_kib", "max", float, {"gt": 0}),
    Gate("max_inference_ms", "inference_ms", "max", float, {"gt": 0}),
    Gate("max_npu_cycles", "npu_cycles", "max", int, {"gt": 0}),
    Gate("min_tosa_snr_db", "tosa_snr_db", "min"),
    Gate("max_tosa_error_lsb", "tosa_max_error_lsb", "max", float, {"ge": 0}),
    Gate("max_tosa_node_error_lsb", "tosa_node_max_error_lsb", "max", float, {"ge": 0},
         "Largest error of one node fed the QDQ model's own inputs (verify/node_errors)"),
    Gate("min_quant_snr_db", "quant_snr_db", "min"),
    Gate("max_transposes", "transposes", "max", int, {"ge": 0}, "Most TRANSPOSE ops allowed in the TOSA graph"),
    Gate("min_accuracy", "accuracy", "min", float, {"ge": 0, "le": 1}, "Top-1 of the TOSA graph on the evaluation set"),
    Gate("max_accuracy_drop", "accuracy_drop", "max", float, {"ge": 0, "le": 1}, "Float minus TOSA top-1 accuracy"),
    Gate("max_fvp_error_lsb", "fvp_max_error_lsb", "max", float, {"ge": 0},
         "FVP outputs vs the TOSA reference model's"),
    Gate("npu_partitions", "npu_partitions", "eq", int, {"ge": 0}, "Exact number of NPU partitions expected"),
    Gate("host_ops", "host_ops", "eq", int, {"ge": 0}, "Exact number of ONNX nodes expected on the host"),
    Gate("max_deployed_error_lsb", "deployed_max_error_lsb", "max", float, {"ge": 0},
         "Most LSB error of the graph the target runs (its partitions or lowering)"),
    Gate("max_collapsed_outputs", "collapsed_outputs", "max", int, {"ge": 0},
         "Most outputs allowed to have collapsed against float (SNR < 6 dB, but a probability within its LSB; "
         "verify/accuracy.py); the default pipeline sets 0"),
    Gate("min_float_snr_db", "float_snr_db", "min", float, {},
         "Lowest output SNR of the deployed graph against the float model (held-back samples)"),
    Gate("min_qdq_float_snr_db", "qdq_float_snr_db", "min", float, {},
         "Lowest output SNR of the QDQ model against the float model"),
    Gate("max_float_error_lsb", "float_max_error_lsb", "max", float, {"ge": 0},
         "Most error of the deployed graph against the float model, in the output's LSB"),
    Gate("min_float_top1_agreement", "float_top1_agreement", "min", float, {"ge": 0, "le": 1},
         "Deployed graph's argmax agreeing with float's (classifier and softmax outputs)"),
    Gate("min_float_mask_iou", "float_mask_iou", "min", float, {"ge": 0, "le": 1},
         "IoU of the deployed graph's and float's sigmoid maps thresholded at 0.5"),
    Gate("min_float_decision_agreement", "float_decision_agreement", "min", float, {"ge": 0, "le": 1},
         "Deployed graph's and float's decisions (one sigmoid probability per sample, at 0.5)"),
    Gate("min_eval_score", "eval_score", "min", float, {}, "`evaluate:` metric of the deployed graph, at least"),
    Gate("max_eval_score", "eval_score", "max", float, {},
         "`evaluate:` metric of the deployed graph, at most (for an error rate)"),
    Gate("max_eval_drop", "eval_drop", "max", float, {},
         "`evaluate:` float model's score minus the deployed graph's (top1 or a user function)"),
    Gate("max_device_error_lsb", "device_max_error_lsb", "max", float, {"ge": 0},
         "The deployable on the virtual device (TFLite Micro + npu-sim) vs the QDQ model, in LSB"),
)
GATE_BY_KEY = {g.key: g for g in GATES}
# Gates every build of a profile gets without asking: a spec (or its pipeline) relaxes one by setting it, to
# another limit or to null. An int8 model that has collapsed against float must not pass as built.
DEFAULT_GATES: dict[str, dict[str, float | int]] = {"int": {"max_collapsed_outputs": 0}, "fp": {}}
