"""What a target deploys, run on the model's own inputs: the one way `evaluate:` and the bench run a deployment
(the npu-sim stage's check against float runs the same deployable: verify/npu_sim.py).

Where the vela stage wrote the build's deployable .tflite, it runs on the virtual device (deploy/virtual_device.py:
each ethos-u operator on npu-sim, the host operators in TensorFlow Lite Micro's interpreter): engine
`virtual-device`. The family's TOSA graph (the TOSA reference model, host partitions in onnxruntime: the graph
npu-sim is held bit-exact to) runs only where there is no deployable, with the reason in `note`: a pipeline
without Vela, a host partition with no TFLite translation (a Cortex-A target runs it in onnxruntime), or an
artifact using what npu-sim does not model. Outputs come as the TOSA check's graphs give them (raw codes of
quantised outputs, ONNX layout), so every comparison applies as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from npubuild.npusim import NotModelled
from npubuild.records.iospec import IOSpec, specs_from_json
from npubuild.records.lower import LowerRecord, PartitionRecord
from npubuild.records.vela import VelaRecord
from npubuild.verify.partitioned import PartitionedModel

VIRTUAL_DEVICE, TOSA_REFERENCE = "virtual-device", "tosa-reference"


def family_partitions(io: LowerRecord, family: str) -> tuple[PartitionRecord, ...]:
    """The partitions a family runs, in order: its own record, the portable split, or model.tosa whole."""
    rec = io.families.get(family) or io.portable
    return rec.partitions if rec is not None else (io.whole_partition([n.name for n in io.nodes]),)


class Deployed:
    """A target's deployment on ONNX-level feeds; `engine` and `note` say what ran it (module docstring)."""

    def __init__(self, lower_dir: Path, io: LowerRecord, family: str, vela_summary: Path | None):
        """`vela_summary`: the vela stage's summary.json, whose `deployable` runs (None: no vela stage)."""
        self._tosa = PartitionedModel(lower_dir, family_partitions(io, family), io.outputs)
        self.outputs: list[IOSpec] = list(io.outputs)
        self.device = None
        self.engine, self.note = TOSA_REFERENCE, "no vela stage: the TOSA graph the family would deploy"
        if vela_summary is None:
            return
        deployable = VelaRecord.read(vela_summary).metrics.get("deployable") or {}
        if not deployable.get("tflite"):
            self.note = "no deployable .tflite (a host partition with no TFLite translation runs in onnxruntime)"
            return
        from npubuild.deploy.virtual_device import OnDevice

        path = vela_summary.parent / deployable["tflite"]
        self.device = OnDevice(path.read_bytes(), specs_from_json(deployable["inputs"]),
                               specs_from_json(deployable["outputs"]), deployable["tflite"])
        self.outputs = self.device.outputs
        self.engine, self.note = VIRTUAL_DEVICE, None

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.device is not None:
            try:
                return self.device(feeds)
            except NotModelled as exc:  # for good: this artifact cannot run on npu-sim
                self.device, self.engine = None, TOSA_REFERENCE
                self.note = f"npu-sim does not model the artifact ({exc.message}): the TOSA graph it is compiled from"
        return self._tosa(dict(feeds))
