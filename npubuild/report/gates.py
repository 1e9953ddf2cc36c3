"""Gates: the spec's `expect:` limits checked against a build's metrics."""

from __future__ import annotations

# expect key -> (metric, comparison); "min": value >= limit, "max": value <= limit, "eq": value == limit
GATES: dict[str, tuple[str, str]] = {
    "npu_offload": ("npu_offload", "min"),
    "max_cpu_ops": ("cpu_ops", "max"),
    "max_sram_kib": ("sram_kib", "max"),
    "max_offchip_kib": ("offchip_kib", "max"),
    "max_inference_ms": ("inference_ms", "max"),
    "max_npu_cycles": ("npu_cycles", "max"),
    "min_tosa_snr_db": ("tosa_snr_db", "min"),
    "max_tosa_error_lsb": ("tosa_max_error_lsb", "max"),
    "min_quant_snr_db": ("quant_snr_db", "min"),
    "max_transposes": ("transposes", "max"),
    "min_accuracy": ("accuracy", "min"),
    "max_accuracy_drop": ("accuracy_drop", "max"),
    "max_fvp_error_lsb": ("fvp_max_error_lsb", "max"),
    "npu_partitions": ("npu_partitions", "eq"),
    "host_ops": ("host_ops", "eq"),
    "max_deployed_error_lsb": ("deployed_max_error_lsb", "max"),
}


def evaluate(expect: dict, metrics: dict) -> list[dict]:
    gates = []
    for key, limit in expect.items():
        if limit is None or key not in GATES:
            continue
        metric, kind = GATES[key]
        value = metrics.get(metric)
        if value is None:
            ok = False
        elif kind == "eq":
            ok = value == limit
        elif kind == "min":
            ok = value >= limit
        else:
            ok = value <= limit
        gates.append({"name": key, "metric": metric, "limit": limit, "value": value, "ok": bool(ok)})
    return gates
