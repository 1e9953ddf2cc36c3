"""The lower stage's io.json as typed records: the contract between the lower stage and every stage after it.

io.json says how to feed and read the lowered graph (IOSpec per input/output), which ONNX node each TOSA
tensor came from, and per NPU family how the model is split between NPU partitions (TOSA, compiled by
Vela) and host partitions (ONNX, onnxruntime). The lower stage writes it through `LowerRecord.to_json`;
the TOSA check, Vela, npu-sim, the FVP, the firmware files and `npubuild simulate` read it through
`LowerRecord.read`, so the file's layout is written down once. `to_json` reproduces io.json byte for byte
as it has been written so far (same keys, same order), so stage outputs and their hashes do not change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from npubuild.fileio import read_json, write_json
from npubuild.records.iospec import GraphSpecs, IOSpec, specs_from_json, specs_to_json


class Where(StrEnum):
    """Where a node or a partition runs: the NPU, or the host (the application processor, running ONNX with
    onnxruntime or another runtime). Code says HOST; the files keep the words they have always had (a public
    format): a partition's kind is "host", a node placement's kind "cpu" (Placement.to_json)."""

    NPU = "npu"
    HOST = "host"


PLACEMENT_WORD = {Where.NPU: "npu", Where.HOST: "cpu"}  # a node placement's kind in io.json and report.json


@dataclass
class Placement:
    """Where one ONNX compute node runs on a family, and for a host placement the support rule that said so."""

    node: str
    op_type: str
    kind: Where
    tosa_ops: list[str]
    rule: str | None = None
    reason: str | None = None
    partition: int = 0
    nodes: int = 1  # the ONNX nodes it stands for: an If or Loop left whole on the host holds its branches' too
    precision: str | None = None  # 16x8, 8x4, int16... in a build with more than int8 (frontend/precision)
    macs: int | None = None  # a host node's multiply-accumulates (ethosu/host_work.py; None: NPU, or not known)

    def to_json(self) -> dict[str, Any]:
        """As io.json and summary.json hold it: without `precision` where there is none and `macs` but on the
        host (an 8x8 NPU build's records are what they were)."""
        d = asdict(self)
        d["kind"] = PLACEMENT_WORD[self.kind]
        if self.precision is None:
            del d["precision"]
        if self.kind != Where.HOST:
            del d["macs"]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Placement:
        return cls(**{**d, "kind": Where.NPU if d["kind"] == "npu" else Where.HOST})


@dataclass(frozen=True)
class PartitionRecord:
    """One partition of a family's model, in run order: an NPU partition (a .tosa and its io) or a host one
    (an .onnx run by onnxruntime; it has no io specs, profile or tensor map)."""

    index: int
    kind: Where
    file: str  # in the lower stage's directory
    inputs: tuple[str, ...]  # ONNX tensor names crossing into / out of the partition
    outputs: tuple[str, ...]
    nodes: tuple[str, ...]  # ONNX compute nodes it runs
    inputs_io: tuple[IOSpec, ...] | None = None
    outputs_io: tuple[IOSpec, ...] | None = None
    profile: str | None = None
    tensor_nodes: Mapping[str, str] | None = None  # TOSA tensor -> ONNX node, when it has its own graph

    @property
    def io(self) -> GraphSpecs:
        """The partition's TOSA graph inputs and outputs (NPU partitions only)."""
        assert self.inputs_io is not None and self.outputs_io is not None, f"partition {self.index} is not NPU"
        return GraphSpecs(self.inputs_io, self.outputs_io)

    def to_json(self, whole_graph: bool = False) -> dict[str, Any]:
        """io.json's partition dict. The whole-graph record (a family's one NPU partition) has always named
        its `file` third, a split partition after its nodes: kept so io.json stays byte-identical."""
        d: dict[str, Any] = {"index": self.index, "kind": self.kind.value}
        if whole_graph:
            d["file"] = self.file
        d.update({"inputs": list(self.inputs), "outputs": list(self.outputs), "nodes": list(self.nodes)})
        if not whole_graph:
            d["file"] = self.file
        if self.inputs_io is not None and self.outputs_io is not None:
            d.update({"inputs_io": specs_to_json(self.inputs_io), "outputs_io": specs_to_json(self.outputs_io),
                      "profile": self.profile})
        if self.tensor_nodes is not None:
            d["tensor_nodes"] = dict(self.tensor_nodes)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PartitionRecord:
        has_io = "inputs_io" in d
        return cls(d["index"], Where(d["kind"]), d["file"], tuple(d["inputs"]), tuple(d["outputs"]), tuple(d["nodes"]),
                   specs_from_json(d["inputs_io"]) if has_io else None,
                   specs_from_json(d["outputs_io"]) if has_io else None,
                   d.get("profile"), d.get("tensor_nodes"))

    def graph_entry(self) -> dict[str, Any]:
        """The partition as the Vela summary's `partition_graph` lists it (no io: that stays in io.json)."""
        return {"index": self.index, "kind": self.kind.value, "file": self.file, "inputs": list(self.inputs),
                "outputs": list(self.outputs), "nodes": list(self.nodes)}


@dataclass(frozen=True)
class FamilyRecord:
    """How one NPU family (support.FAMILIES) runs the model: its partitions, every node's placement and,
    when it does not run model.tosa as is, the partitioned model's max error against the QDQ model."""

    partitions: tuple[PartitionRecord, ...]
    placements: tuple[Placement, ...]
    max_error_lsb: float | None = None
    # its own whole graph gave model.tosa's outputs bit for bit (exact rewrites only; ethosu/families.py):
    # its error is model.tosa's, and the TOSA check compares it with model.tosa the same way
    same_as_model_tosa: bool = False

    @property
    def npu_partitions(self) -> int:
        return sum(1 for p in self.partitions if p.kind == Where.NPU)

    @property
    def host_partitions(self) -> int:
        return sum(1 for p in self.partitions if p.kind == Where.HOST)

    @property
    def host_ops(self) -> int:
        return sum(p.nodes for p in self.placements if p.kind == Where.HOST)

    @property
    def npu_nodes(self) -> int:
        return sum(p.nodes for p in self.placements if p.kind == Where.NPU)

    @property
    def host_macs(self) -> int | None:
        """The host nodes' multiply-accumulates (0: nothing on the host); None where one's are not known."""
        host = [p.macs for p in self.placements if p.kind == Where.HOST]
        return None if any(m is None for m in host) else sum(m for m in host if m is not None)

    @property
    def whole_graph(self) -> bool:
        """One NPU partition: the family runs one whole graph (model.tosa or its own <family>_model.tosa)."""
        return len(self.partitions) == 1 and self.partitions[0].kind == Where.NPU

    @property
    def runs_model_tosa(self) -> bool:
        """The family runs model.tosa itself (nothing split, no lowering of its own)."""
        return len(self.partitions) < 2 and self.partitions[0].file == "model.tosa"

    def placement_metrics(self) -> dict[str, Any]:
        """Where every ONNX node runs on this family (the offload report) and the gateable counts: the vela
        stage's figures of placement (summary.json), which a build whose Vela did not finish reports from here."""
        return {"npu_partitions": self.npu_partitions, "host_partitions": self.host_partitions,
                "host_ops": self.host_ops, "host_macs": self.host_macs, "npu_nodes": self.npu_nodes,
                "partitioned_max_error_lsb": self.max_error_lsb,
                "offloads": [p.to_json() for p in self.placements],
                "partition_graph": [p.graph_entry() for p in self.partitions]}

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"partitions": [p.to_json(self.whole_graph) for p in self.partitions],
                             "placements": [p.to_json() for p in self.placements],
                             "npu_partitions": self.npu_partitions, "host_partitions": self.host_partitions,
                             "host_ops": self.host_ops}
        if self.max_error_lsb is not None:
            d["max_error_lsb"] = self.max_error_lsb
        if self.same_as_model_tosa:
            d["same_as_model_tosa"] = True
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FamilyRecord:
        return cls(tuple(PartitionRecord.from_json(p) for p in d["partitions"]),
                   tuple(Placement.from_json(p) for p in d["placements"]), d.get("max_error_lsb"),
                   bool(d.get("same_as_model_tosa", False)))


@dataclass(frozen=True)
class NodeRecord:
    """One ONNX compute node and the TOSA ops the lowering made of it."""

    name: str
    op_type: str
    tosa_ops: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op_type": self.op_type, "tosa_ops": list(self.tosa_ops)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NodeRecord:
        return cls(d["name"], d["op_type"], tuple(d["tosa_ops"]))


@dataclass(frozen=True)
class LowerRecord:
    """io.json: the whole-model graph's io (model.tosa), its nodes and tensor map, and each family's split.

    A model with nodes no lowering takes has no model.tosa: `portable` is then the split that runs it (those
    nodes on the host, the rest in NPU partitions) and the io is that of the graph inputs and outputs.

    It is a GraphIO (inputs/outputs), so it feeds tosa.run.run_tosa as it is."""

    profile: str
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    nodes: tuple[NodeRecord, ...] = ()
    tensor_nodes: Mapping[str, str] = field(default_factory=dict)
    families: Mapping[str, FamilyRecord] = field(default_factory=dict)
    portable: FamilyRecord | None = None  # no single TOSA graph (no model.tosa): the split that stands for it

    @property
    def whole_graph(self) -> bool:
        """model.tosa runs the whole model (every node lowered); else `portable` does, partition by partition."""
        return self.portable is None

    def whole_partition(self, nodes: Sequence[str]) -> PartitionRecord:
        """model.tosa as a family's one NPU partition running `nodes`."""
        return PartitionRecord(0, Where.NPU, "model.tosa", tuple(s.onnx_name for s in self.inputs),
                               tuple(s.onnx_name for s in self.outputs), tuple(nodes), self.inputs, self.outputs,
                               self.profile)

    def npu_partitions(self, fam: str) -> list[PartitionRecord]:
        """What Vela compiles for this family, each with the tensor map of its own graph (model.tosa's when
        a family has no record, e.g. an FP build)."""
        rec = self.families.get(fam) or self.portable
        parts = rec.partitions if rec is not None else (self.whole_partition([n.name for n in self.nodes]),)
        return [p if p.tensor_nodes is not None else replace(p, tensor_nodes=self.tensor_nodes)
                for p in parts if p.kind == Where.NPU]

    def to_json(self) -> dict[str, Any]:
        d = {"profile": self.profile, "inputs": specs_to_json(self.inputs), "outputs": specs_to_json(self.outputs),
             "nodes": [n.to_json() for n in self.nodes], "tensor_nodes": dict(self.tensor_nodes),
             "families": {f: r.to_json() for f, r in self.families.items()}}
        if self.portable is not None:
            d["portable"] = self.portable.to_json()
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LowerRecord:
        return cls(d["profile"], specs_from_json(d["inputs"]), specs_from_json(d["outputs"]),
                   tuple(NodeRecord.from_json(n) for n in d.get("nodes", [])), d.get("tensor_nodes", {}),
                   {f: FamilyRecord.from_json(r) for f, r in (d.get("families") or {}).items()},
                   FamilyRecord.from_json(d["portable"]) if d.get("portable") else None)

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def read(cls, path: Path) -> LowerRecord:
        return cls.from_json(read_json(path))


@dataclass(frozen=True)
class PartitionedCheck:
    """The TOSA check's measure of one family's partitioned (or own-lowered) model against the QDQ model:
    the error of what that family really deploys (the report's deployed_max_error_lsb)."""

    max_error_lsb: float
    samples: int
    npu_partitions: int
    host_partitions: int
    # run on this many samples and bit-identical to model.tosa there (exact rewrites): the error is model.tosa's
    bitexact_samples: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if self.bitexact_samples is None:
            del d["bitexact_samples"]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PartitionedCheck:
        return cls(d["max_error_lsb"], d["samples"], d["npu_partitions"], d["host_partitions"],
                   d.get("bitexact_samples"))
