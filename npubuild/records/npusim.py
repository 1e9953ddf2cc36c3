"""The npu-sim stage's npusim.json: skipped with the reason, or the artifact's bit-exactness on the samples."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npubuild.records.accuracy import FloatCheck
from npubuild.records.build import Skip


@dataclass(frozen=True)
class NpuSimRecord:
    """What npu-sim found: `skip` (the stage could not conclude, with why), else the partitions and samples run,
    whether every output element matched the TOSA reference model, and where the first mismatch was."""

    skip: Skip | None
    samples: int = 0
    partitions: int = 0
    bitexact: bool | None = None
    npu_ops: int = 0
    sim_seconds: float = 0.0
    mismatches: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # output -> {elements, of}
    first_bad_sample: int | None = None
    first_bad_op: str | None = None
    # the deployable on the virtual device against the QDQ model (builds with host partitions; deploy/)
    device_max_error_lsb: float | None = None
    device_samples: int | None = None
    tflm_arena_bytes: int | None = None
    # what the device computed on those samples against the float model (verify/npu_sim.py); None where the
    # deployable did not run (a failed comparison, no deployable)
    float_check: FloatCheck | None = None

    def to_json(self) -> dict[str, Any]:
        if self.skip is not None:
            return self.skip.to_json()
        return {"skipped": False, "samples": self.samples, "partitions": self.partitions, "bitexact": self.bitexact,
                "npu_ops": self.npu_ops, "sim_seconds": self.sim_seconds,
                "mismatches": {k: dict(v) for k, v in self.mismatches.items()},
                "first_bad_sample": self.first_bad_sample, "first_bad_op": self.first_bad_op,
                "device_max_error_lsb": self.device_max_error_lsb, "device_samples": self.device_samples,
                "tflm_arena_bytes": self.tflm_arena_bytes,
                "float_check": self.float_check.to_json() if self.float_check is not None else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NpuSimRecord:
        skip = Skip.from_metrics(d)
        if skip is not None:
            return cls(skip)
        return cls(None, d["samples"], d["partitions"], d["bitexact"], d["npu_ops"], d["sim_seconds"],
                   d.get("mismatches") or {}, d.get("first_bad_sample"), d.get("first_bad_op"),
                   d.get("device_max_error_lsb"), d.get("device_samples"), d.get("tflm_arena_bytes"),
                   FloatCheck.from_json(d["float_check"]) if d.get("float_check") else None)
