"""Run what a target deploys: its family's partitions in order, each NPU partition on npu-sim from Vela's raw
artifact (the command stream the device runs), host partitions on onnxruntime.

An NPU partition with no raw artifact (Vela wrote tflite) or one npu-sim does not model runs on the TOSA
reference model instead, which the npu-sim stage proves bit-exact with the artifact where both run; `runs_on`
says which each partition used, so a report never calls a TOSA figure a command-stream one. Outputs come in
the form PartitionedModel gives (raw integers for quantized outputs, ONNX layout), so every comparison of
the TOSA check applies as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npubuild.npusim import NotModelled
from npubuild.records.iospec import IOSpec
from npubuild.records.lower import LowerRecord, PartitionRecord
from npubuild.records.vela import VelaRecord
from npubuild.verify.partitioned import PartitionedModel

NPU_SIM, TOSA, HOST = "npu-sim", "tosa-reference", "host"


def family_partitions(io: LowerRecord, family: str) -> tuple[PartitionRecord, ...]:
    """The partitions a family runs, in order: its own record, the portable split, or model.tosa whole."""
    rec = io.families.get(family) or io.portable
    return rec.partitions if rec is not None else (io.whole_partition([n.name for n in io.nodes]),)


class DeployedModel(PartitionedModel):
    """A target's deployment, run partition by partition (npu-sim where an artifact exists and is modelled)."""

    def __init__(self, lower_dir: Path, io: LowerRecord, family: str, vela_summary: Path | None,
                 outputs: Sequence[IOSpec] | None = None):
        """`vela_summary`: the vela stage's summary.json, whose partitions' raw artifacts npu-sim runs (None: the
        TOSA reference model runs every NPU partition)."""
        super().__init__(lower_dir, family_partitions(io, family), outputs if outputs is not None else io.outputs)
        self.artifacts: dict[int, Path] = {}
        if vela_summary is not None:
            self.artifacts = {p.index: vela_summary.parent / p.npz for p in VelaRecord.read(vela_summary).partitions}
        self.runs_on: dict[int, str] = {p.index: HOST if p.kind == "host" else self._npu_engine(p)
                                        for p in self.partitions}
        self.not_modelled: str | None = None
        self._raw: dict[int, object] = {}

    def _npu_engine(self, part: PartitionRecord) -> str:
        npz = self.artifacts.get(part.index)
        return NPU_SIM if npz is not None and npz.is_file() else TOSA

    @property
    def engine(self) -> str:
        """What ran the NPU partitions: npu-sim (every one), tosa-reference (every one), or mixed."""
        kinds = {k for k in self.runs_on.values() if k != HOST}
        return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else HOST)

    def run_npu(self, part: PartitionRecord, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.runs_on[part.index] != NPU_SIM:
            return super().run_npu(part, feeds)
        from npubuild.npusim.npz import load_raw
        from npubuild.npusim.sim import run

        if part.index not in self._raw:
            self._raw[part.index] = load_raw(self.artifacts[part.index])
        io = part.io
        try:
            result = run(self._raw[part.index], [spec.to_tosa(feeds[spec.onnx_name]) for spec in io.inputs],
                         keep_ofms=False)
        except NotModelled as exc:  # fall back for good: this artifact cannot run on npu-sim
            self.runs_on[part.index], self.not_modelled = TOSA, exc.message
            return super().run_npu(part, feeds)
        return {spec.onnx_name: spec.from_tosa(np.asarray(y).reshape(spec.shape))
                for spec, y in zip(io.outputs, result.outputs, strict=True)}
