"""Vela's per-layer performance (its `--verbose-performance` CSV) traced back to ONNX nodes.

Vela names each scheduled layer after its output tensor; the lower stage
records, per TOSA tensor, the ONNX node whose lowering produced it
(io.json `tensor_nodes`), so every layer's cycles, MACs and memory traffic can
be charged to the node the user wrote.

The roofline below sets each layer's Vela estimate against the limits of the
machine: its MACs at the MAC array's peak, the cycles the NPU's datapath needs
for the op whatever the memories do (Vela's own model of the MAC array's blocks
and the output unit's elements per cycle: an elementwise op, a pool or a
RESCALE has no MACs but is not free; on U85-256 it runs at 2-4 int8 elements a
cycle), and the data bytes Vela moves for it over each memory at that memory's
peak bandwidth. Their sum over the network
(`bound_ms`) over Vela's estimate (`efficiency`) says how far a build is from
what the hardware could do; the layers with the largest gap say where.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

from npubuild.config.accelerator import Accelerator
from npubuild.config.schema import TargetProfile
from npubuild.ethosu.vela_ini import VELA_MEMORY

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
        layer["partition"] = partition
        layers.append(layer)
    return charge_nodes(layers, tensor_nodes)


def charge_nodes(layers: list[dict], tensor_nodes: dict[str, str]) -> list[dict]:
    """Each layer with the ONNX node it is charged to (`onnx_node`, None if unknown), set in place."""
    for layer in layers:
        layer["onnx_node"] = tensor_nodes.get(layer["tensor"])
        layer.pop("vela_inserted", None)
    for i, layer in enumerate(layers):
        if layer["onnx_node"] is None and ("_" in layer["tensor"] or layer["tensor"].startswith("#")):
            # Vela's own layers are named after their input ("layer-18_transpose" before a REDUCE_SUM) or
            # numbered ("#242": the steps Vela splits a TRANSPOSE into): charge them to the node they were
            # inserted for, the next layer's
            following = next((lay["onnx_node"] for lay in layers[i + 1:] if lay["onnx_node"]), None)
            layer["onnx_node"] = following or tensor_nodes.get(layer["tensor"].rsplit("_", 1)[0])
            layer["vela_inserted"] = True
    return layers


def top_layers(layers: list[dict], n: int = 5) -> list[dict]:
    """The n most expensive layers by cycles."""
    return sorted(layers, key=lambda lay: lay.get("cycles") or 0, reverse=True)[:n]


# ----------------------------------------------------------------------------------------------- roofline
#
# Bytes per layer and memory come from Vela's debug database (`--enable-debug-db`, `<stem>_debug.xml`): its
# `perf_debug` table has, per scheduled layer, `<Memory><Group>_read/_write` for each memory of the system config
# (Sram, Dram, OnChipFlash, OffChipFlash; groups FeatureMap, Weights, Scales, Lut): the bytes Vela's performance
# model charges the bus, which include burst rounding (a 3-channel NHWC input read from DRAM in 3-byte pieces
# of 64-byte bursts costs ~16x its size), and `<Memory>_read_efficiency/_write_efficiency`, the share of them that
# is data (regor network_performance.cpp: (bytes - burst overhead) / bytes, over all groups). The roofline divides
# the data bytes by the peak bandwidth, so burst waste shows as a gap, as a slow MAC array does. `lutram` is the
# NPU's internal LUT RAM, not a system memory, and is left out. The `perf` table beside it gives each row's layer
# name, in the order of the per-layer CSV.

SYSTEM_MEMORIES = ("Sram", "Dram", "OnChipFlash", "OffChipFlash")
GROUPS = ("FeatureMap", "Weights", "Scales", "Lut")
_TABLE = re.compile(r'<table name="([^"]+)">\n<!\[CDATA\[\n(.*?)\]\]>', re.S)


def _num(raw: str | None) -> float:
    try:
        return float(raw or 0)
    except ValueError:
        return 0.0


def parse_layer_bytes(debug_xml: Path) -> list[dict]:
    """Per Vela layer (CSV order): {"tensor", "bytes": {memory: bytes charged}, "useful_bytes": {memory: data}}.

    Only the `perf` and `perf_debug` tables are read, and of perf_debug's ~100 columns only the byte counts and
    efficiencies (MobileViT-xxs: a 5.7 MB table of 11616 rows, 1.0 -> 0.3 s read by column index)."""
    bodies = {name: body for name, body in _TABLE.findall(debug_xml.read_text())
              if name in ("perf", "perf_debug", "perf_debug_main")}
    moved = _byte_columns(bodies.get("perf_debug", ""))
    datapath = _datapath_cycles(bodies.get("perf_debug_main", ""))
    perf_rows = csv.reader(io.StringIO(bodies.get("perf", "")))
    header = next(perf_rows, [])
    id_at, name_at = (header.index(k) if k in header else None for k in ("id", "name"))
    out = []
    for row in perf_rows:
        charged, useful = moved.get(row[id_at], ({}, {})) if id_at is not None else ({}, {})
        layer = {"tensor": row[name_at] if name_at is not None else "", "bytes": charged, "useful_bytes": useful}
        if id_at is not None and row[id_at] in datapath:
            layer["datapath_cycles"] = datapath[row[id_at]]
        out.append(layer)
    return out


def _datapath_cycles(body: str) -> dict[str, int]:
    """perf_debug_main's rows by id: the cycles the NPU's datapath needs for the op, memory left out:
    max(mac_cycles, ao_cycles). regor's performance model (ethos_u85_performance.cpp, EstimateConvCycles and
    EstimateOutputCyclesPerElement) counts there the MAC array's cycles over the op's blocks (a conv's depth
    not a multiple of the micro-block, a depthwise at 4 taps a step, a CLAMP or RESCALE run as a 1x1 pool at
    2 int8 elements a cycle on U85-256) and the output unit's (an elementwise op at 0.25 cycles an element
    on U85-256): work the array cannot do faster, whatever the memories do (bench/elementwise_peaks.md)."""
    rows = csv.reader(io.StringIO(body))
    header = next(rows, [])
    at = {k: i for i, k in enumerate(header)}
    if "id" not in at:
        return {}
    cols = [at[k] for k in ("mac_cycles", "ao_cycles") if k in at]
    return {row[at["id"]]: int(max((_num(row[i]) for i in cols), default=0)) for row in rows}


def _efficiency(row: list[str], at: int | None) -> float:
    """A read or write efficiency, at most 1; 1 where Vela leaves it out or empty."""
    return min(_num((row[at] if at is not None else None) or 1), 1.0)


def _byte_columns(body: str) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """perf_debug's rows by id: (bytes charged per memory, data bytes per memory), as parse_layer_bytes gives them."""
    rows = csv.reader(io.StringIO(body))
    header = next(rows, [])
    at = {k: i for i, k in enumerate(header)}
    if "id" not in at:
        return {}
    columns = [(mem, [at[f"{mem}{g}_read"] for g in GROUPS if f"{mem}{g}_read" in at],
                [at[f"{mem}{g}_write"] for g in GROUPS if f"{mem}{g}_write" in at],
                at.get(f"{mem}_read_efficiency"), at.get(f"{mem}_write_efficiency")) for mem in SYSTEM_MEMORIES]
    out = {}
    for row in rows:
        charged, useful = {}, {}
        for mem, reads, writes, read_eff, write_eff in columns:
            read = sum(_num(row[i]) for i in reads)
            write = sum(_num(row[i]) for i in writes)
            if read or write:
                charged[mem] = int(read + write)
                # an efficiency above 1 (Vela 5.2 gives U55 MatMul's scratch traffic ~2.75) would claim more data
                # than Vela moves: the data bytes are at most the charged ones
                useful[mem] = round(read * _efficiency(row, read_eff) + write * _efficiency(row, write_eff))
        out[row[at["id"]]] = (charged, useful)
    return out


def attach_bytes(layers: list[dict], moved: list[dict]) -> None:
    """Give each parsed CSV layer its bytes per memory (both lists come from Vela's one `perf` table, in order)."""
    if len(moved) != len(layers) or any(m["tensor"] != lay["tensor"] for m, lay in zip(moved, layers, strict=False)):
        return  # a Vela whose debug database does not line up with its CSV: no roofline rather than a wrong one
    for lay, m in zip(layers, moved, strict=True):
        lay["bytes"], lay["useful_bytes"] = m["bytes"], m["useful_bytes"]
        if "datapath_cycles" in m:
            lay["datapath_cycles"] = m["datapath_cycles"]


@dataclass(frozen=True)
class MachineModel:
    """The peaks a roofline divides by: int8 MACs per NPU cycle, the NPU clock, bytes per NPU cycle per memory.

    Bandwidth as Vela 5.2 models it (regor.cpp, which turns vela.ini's system config into its memory model):
    `clock_scale x AXI width x ports_used` bytes per NPU cycle, the AXI width being 8 bytes for a system config
    whose name starts with `Ethos_U55` and 16 bytes otherwise (Vela's Python architecture_features.py has the same
    8/16 bytes per cycle for U55 vs U65/U85); npubuild names the section after the generation (vela_ini), so a
    U55 gets 8 (config/accelerator.py's `axi_bytes`). Vela prints the result as `Design peak <memory> bandwidth` (x clock, in GiB/s).
    """

    macs_per_cycle: int
    clock_hz: float
    bytes_per_cycle: dict[str, float]

    @staticmethod
    def of(profile: TargetProfile) -> MachineModel:
        acc = Accelerator.parse(profile.accelerator)
        bw = {VELA_MEMORY[p.kind]: p.clock_scale * acc.facts.axi_bytes * (p.ports_used or 1)
              for p in profile.pools.values()}
        return MachineModel(acc.macs, profile.clock_mhz * 1e6, bw)


def layer_roofline(layer: dict, machine: MachineModel) -> dict:
    """The layer's MAC-bound and memory-bound (data bytes at peak bandwidth) times in ms, their max, what binds
    it and its gap to Vela's estimate."""
    ms = 1e3 / machine.clock_hz  # one NPU cycle in ms
    mac_ms = (layer.get("macs") or 0) / machine.macs_per_cycle * ms
    mem_ms = {mem: b / machine.bytes_per_cycle[mem] * ms for mem, b in (layer.get("useful_bytes") or {}).items()
              if mem in machine.bytes_per_cycle}
    mem_bound = max(mem_ms.values(), default=0.0)  # the memories sit on their own AXI ports: they overlap
    datapath_ms = (layer.get("datapath_cycles") or 0) * ms  # the array's own cycles for this op (_datapath_cycles)
    compute = max(mac_ms, datapath_ms)
    bound = max(compute, mem_bound)
    by = ("MAC" if mac_ms >= datapath_ms else "datapath") if compute >= mem_bound else max(mem_ms, key=mem_ms.get)
    estimated = (layer.get("cycles") or 0) * ms
    return {"mac_bound_ms": round(mac_ms, 6), "datapath_bound_ms": round(datapath_ms, 6),
            "memory_bound_ms": {k: round(v, 6) for k, v in mem_ms.items()},
            "bound_ms": round(bound, 6), "bound_by": by, "estimated_ms": round(estimated, 6),
            "gap_ms": round(estimated - bound, 6)}


def roofline(layers: list[dict], profile: TargetProfile, inference_ms: float, worst: int = 5) -> dict:
    """Network figures: `bound_ms` (sum of the layers' bounds), `efficiency` (bound / Vela's estimate) and the
    `roofline` record (peaks, MAC- and memory-bound sums, the layers furthest from their bound). Adds each
    layer's own figures under layer["roofline"]. None throughout when Vela gave no bytes per layer."""
    if not layers or any("useful_bytes" not in lay for lay in layers):
        return {"bound_ms": None, "efficiency": None, "roofline": None}
    machine = MachineModel.of(profile)
    for lay in layers:
        lay["roofline"] = layer_roofline(lay, machine)
    figures = [lay["roofline"] for lay in layers]
    bound = sum(f["bound_ms"] for f in figures)
    gaps = sorted(layers, key=lambda lay: lay["roofline"]["gap_ms"], reverse=True)[:worst]
    return {
        "bound_ms": round(bound, 6),
        "efficiency": round(bound / inference_ms, 4) if inference_ms else None,
        "roofline": {
            "macs_per_cycle": machine.macs_per_cycle, "clock_mhz": machine.clock_hz / 1e6,
            "bytes_per_cycle": machine.bytes_per_cycle,
            "peak_gib_s": {k: round(v * machine.clock_hz / 2**30, 3) for k, v in machine.bytes_per_cycle.items()},
            "mac_bound_ms": round(sum(f["mac_bound_ms"] for f in figures), 6),
            "datapath_bound_ms": round(sum(f["datapath_bound_ms"] for f in figures), 6),
            "memory_bound_ms": round(sum(max(f["memory_bound_ms"].values(), default=0.0) for f in figures), 6),
            "layers_bound_by": {k: sum(1 for f in figures if f["bound_by"] == k) for k in
                                sorted({f["bound_by"] for f in figures})},
            "worst_layers": [{"tensor": lay["tensor"], "onnx_node": lay.get("onnx_node"), "npu_op": lay.get("npu_op"),
                              "partition": lay.get("partition"), **lay["roofline"]} for lay in gaps],
        },
    }
