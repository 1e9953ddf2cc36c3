"""Vela's per-layer performance (its `--verbose-performance` CSV) traced back to ONNX nodes.

Vela names each scheduled layer after its output tensor; the lower stage
records, per TOSA tensor, the ONNX node whose lowering produced it
(io.json `tensor_nodes`), so every layer's cycles, MACs and memory traffic can
be charged to the node the user wrote.
"""

from __future__ import annotations

import csv
from pathlib import Path

COLUMNS = {
    "Original Operator": ("tosa_op", str),
    "NNG Operator": ("npu_op", str),
    "Target": ("target", str),
    "Staging Usage": ("staging_bytes", int),
    "Op Cycles": ("cycles", int),
    "Network% (cycles)": ("cycles_pct", float),
    "NPU": ("npu_cycles", int),
    "SRAM AC": ("sram_access_cycles", int),
    "DRAM AC": ("dram_access_cycles", int),
    "OnFlash AC": ("on_flash_access_cycles", int),
    "OffFlash AC": ("off_flash_access_cycles", int),
    "MAC Count": ("macs", int),
    "Util% (MAC)": ("mac_util_pct", float),
    "Name": ("tensor", str),
}


def _value(kind: type, raw: str):
    raw = (raw or "").strip()
    if kind is str:
        return raw
    try:
        v = float(raw)
    except ValueError:
        return None
    return int(v) if kind is int else round(v, 3)


def parse_per_layer(path: Path, tensor_nodes: dict[str, str], partition: int = 0) -> list[dict]:
    """One dict per Vela layer, with the ONNX node its output tensor came from (None if unknown)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    layers = []
    for row in rows:
        layer = {key: _value(kind, row.get(col, "")) for col, (key, kind) in COLUMNS.items()}
        layer["onnx_node"] = tensor_nodes.get(layer["tensor"])
        layer["partition"] = partition
        layers.append(layer)
    for i, layer in enumerate(layers):
        if layer["onnx_node"] is None and "_" in layer["tensor"]:
            # Vela's own layers (e.g. "layer-18_transpose" before a REDUCE_SUM) are named after their input:
            # charge them to the node they were inserted for, the next layer's
            following = next((lay["onnx_node"] for lay in layers[i + 1:] if lay["onnx_node"]), None)
            layer["onnx_node"] = following or tensor_nodes.get(layer["tensor"].rsplit("_", 1)[0])
            layer["vela_inserted"] = True
    return layers


def top_layers(layers: list[dict], n: int = 5) -> list[dict]:
    """The n most expensive layers by cycles."""
    return sorted(layers, key=lambda lay: lay.get("cycles") or 0, reverse=True)[:n]
