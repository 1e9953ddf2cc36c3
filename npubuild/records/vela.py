"""The vela stage's summary.json as a typed record: per compiled NPU partition its files and figures, and the
whole model's figures the report, npu-sim and the FVP read.

summary.json is written as it has always been (one dict: the whole model's figures, a flat list of artifact
names, the firmware of each partition in order, the first partition's Vela summary and the others'); `from_json`
gives each partition its files by the names Vela and the stage give them (`vela_stem`, VelaPartition.named),
which are written down here once, beside the writer's use of them (ethosu/vela.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npubuild.fileio import read_json
from npubuild.records.lower import PartitionRecord, Where


def vela_stem(index: int, tosa_file: str) -> str:
    """Vela names what it writes after its input file: `model` for the whole model's graph, else the graph's own
    stem (`u55_part0`, `u55_model` for a family's own whole graph)."""
    return "model" if index == 0 and tosa_file == "model.tosa" else Path(tosa_file).stem


@dataclass(frozen=True)
class FirmwareFiles:
    """A compiled partition's firmware files (paths relative to the vela stage dir) and the sizes it needs."""

    prefix: str
    manifest: str
    header: str
    source: str
    arena_size: int
    fast_scratch_size: int

    def to_json(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "manifest": self.manifest, "header": self.header, "source": self.source,
                "arena_size": self.arena_size, "fast_scratch_size": self.fast_scratch_size}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FirmwareFiles:
        return cls(d["prefix"], d["manifest"], d["header"], d["source"], d["arena_size"], d["fast_scratch_size"])


@dataclass(frozen=True)
class VelaPartition:
    """One NPU partition as Vela compiled it; files relative to the vela stage dir but `tosa` (the lower
    stage's)."""

    index: int  # in the family's partition graph
    tosa: str  # the graph Vela compiled, in the lower stage's directory
    stem: str  # vela_stem: what its files are named after
    tflite: str  # Vela's model (what npu-sim runs and the deployable is made of): in tflite/ for raw output
    npz: str | None  # Vela's raw format, written from the same compile when the spec asks for raw output
    per_layer_csv: str | None
    log: str
    firmware: FirmwareFiles | None
    summary: Mapping[str, str]  # Vela's summary CSV row

    @classmethod
    def named(cls, index: int, tosa: str, artifacts: Sequence[str], firmware: FirmwareFiles | None,
              summary: Mapping[str, str]) -> VelaPartition:
        """The partition's files by their names: `<stem>_vela.tflite` in the stage dir (tflite output) or tflite/
        (beside the .npz of raw output), `<stem>_vela.npz`, `<stem>_per-layer.csv`, and its log, `vela.log` for
        the whole model's graph, `<stem>.vela.log` otherwise."""
        stem = vela_stem(index, tosa)
        have = set(artifacts)
        tflite, npz, csv = f"{stem}_vela.tflite", f"{stem}_vela.npz", f"{stem}_per-layer.csv"
        return cls(index, tosa, stem, tflite if tflite in have else f"tflite/{tflite}", npz if npz in have else None,
                   csv if csv in have else None, "vela.log" if stem == "model" else f"{stem}.vela.log", firmware,
                   summary)


@dataclass(frozen=True)
class VelaRecord:
    """summary.json: `metrics` is all of it as written (the report's metric table reads its figures by name:
    config/metrics.py); the fields are what the other stages and the report's links read."""

    metrics: Mapping[str, Any]
    accelerator: str | None
    partitions: tuple[VelaPartition, ...]  # the NPU partitions Vela compiled, in run order
    partition_graph: tuple[PartitionRecord, ...]  # the family's partitions, NPU and host (no io)
    npu_partitions: int | None
    host_partitions: int | None
    host_ops: int | None
    npu_nodes: int | None
    vela_cpu_ops: int
    npu_cycles: int | None
    deployment: str | None  # the deployment manifest, relative to the stage dir
    artifacts: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return dict(self.metrics)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> VelaRecord:
        """The record of a summary.json (or of the placement figures alone: a build whose Vela did not finish)."""
        graph = tuple(PartitionRecord(p["index"], Where(p["kind"]), p["file"], tuple(p["inputs"]), tuple(p["outputs"]),
                                      tuple(p["nodes"])) for p in d.get("partition_graph") or ())
        npu = [(p.index, p.file) for p in graph if p.kind == Where.NPU] or [(0, "model.tosa")]
        artifacts = tuple(d.get("artifacts") or ())
        firmware = [FirmwareFiles.from_json(f) if isinstance(f, Mapping) else None for f in d.get("firmware") or ()]
        summaries = [d.get("summary") or {}] + [{k: v for k, v in s.items() if k != "partition"}
                                                for s in d.get("partition_summaries") or ()]
        compiled = len(firmware)  # one per partition Vela compiled
        parts = tuple(VelaPartition.named(i, f, artifacts, firmware[n], summaries[n] if n < len(summaries) else {})
                      for n, (i, f) in enumerate(npu[:compiled]))
        deployment = d.get("deployment")
        return cls(d, d.get("accelerator"), parts, graph, d.get("npu_partitions"), d.get("host_partitions"),
                   d.get("host_ops"), d.get("npu_nodes"), int(d.get("vela_cpu_ops") or 0), d.get("npu_cycles"),
                   deployment if isinstance(deployment, str) else None, artifacts)

    @classmethod
    def read(cls, path: Path) -> VelaRecord:
        return cls.from_json(read_json(path))

    @property
    def whole_graph(self) -> bool:
        """One NPU partition and no host one: the model runs as one Vela model (what the FVP runs)."""
        return not self.host_partitions and (self.npu_partitions or 1) <= 1
