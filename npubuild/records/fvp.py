"""The FVP stage's fvp.json: skipped with the reason, or the run's cycles and errors against the TOSA model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npubuild.records.build import Skip


@dataclass(frozen=True)
class FvpRecord:
    """What the FVP run measured: the NPU's cycles (its PMU) beside Vela's estimate, and per output its max
    error in LSB against the TOSA reference model; `skip` where the stage could not run the model."""

    skip: Skip | None
    fvp: str = ""  # the FVP binary's name
    fvp_npu_cycles: int | None = None
    vela_npu_cycles: int | None = None
    fvp_vs_vela_cycles: float | None = None
    pmu: Mapping[str, int] = field(default_factory=dict)
    fvp_max_error_lsb: float | None = None
    fvp_outputs: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        if self.skip is not None:
            return self.skip.to_json()
        return {"fvp": self.fvp, "fvp_npu_cycles": self.fvp_npu_cycles, "vela_npu_cycles": self.vela_npu_cycles,
                "fvp_vs_vela_cycles": self.fvp_vs_vela_cycles, "pmu": dict(self.pmu),
                "fvp_max_error_lsb": self.fvp_max_error_lsb, "fvp_outputs": dict(self.fvp_outputs)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FvpRecord:
        skip = Skip.from_metrics(d)
        if skip is not None:
            return cls(skip)
        return cls(None, d["fvp"], d.get("fvp_npu_cycles"), d.get("vela_npu_cycles"), d.get("fvp_vs_vela_cycles"),
                   d.get("pmu") or {}, d.get("fvp_max_error_lsb"), d.get("fvp_outputs") or {})
