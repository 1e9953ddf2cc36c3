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
    *_m("tosa-check", "tosa_mean_error_lsb", "tosa_cosine", "accuracy", "float_accuracy", "accuracy_drop",
        "outputs", "io"),
    Metric("tosa_ops", "lower", "tosa_op_count"),
    Metric("quantization", "quantize"),  # the recipe the quantize stage chose and each candidate's SNR vs float
    Metric("precision", "precision"),  # int16 groups and int4 layers, fixed or chosen (frontend/precision/)
    Metric("transposes", "lower"),
    *_m("vela", "vela_npu_ops", "vela_cpu_ops", "memory_mode", "pools", "npu_partitions", "host_ops", "offloads",
        "partition_graph", "memory", "layers", "top_layers", "firmware", "deployment"),
    # roofline (ethosu/perf.roofline): sum over Vela's layers of max(MAC-bound, memory-bound) time, and that
    # bound over Vela's estimated inference time
    *_m("vela", "bound_ms", "efficiency", "roofline"),
    Metric("deployed_max_error_lsb", None),
    # each node fed the QDQ model's own inputs (verify/node_errors): the lowering's own error, not the
    # float32 reference's rounding noise grown through the layers after it; the worst node and output by name
    *_m("tosa-check", "tosa_node_max_error_lsb", "tosa_worst_node", "tosa_worst_output"),
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
    Gate("max_device_error_lsb", "device_max_error_lsb", "max", float, {"ge": 0},
         "The deployable on the virtual device (TFLite Micro + npu-sim) vs the QDQ model, in LSB"),
)
GATE_BY_KEY = {g.key: g for g in GATES}
