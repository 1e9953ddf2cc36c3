"""The tosa-check stage's numerics.json, read typed: the TOSA graph's error against the model it is held to,
per family the deployed (partitioned or own-lowered) graph's, the per-node check, and per family the deployed
graph against the float model (records/accuracy.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from npubuild.records.accuracy import FloatCheck, FloatChecks
from npubuild.records.lower import PartitionedCheck


@dataclass(frozen=True)
class CheckRecord:
    """numerics.json; `metrics` is all of it as written (the report's metric table reads it by name)."""

    metrics: Mapping[str, Any]
    samples: int
    profile: str
    tosa_snr_db: float | None
    tosa_max_error_lsb: float | None
    quant_snr_db: float | None
    partitioned: Mapping[str, PartitionedCheck] = field(default_factory=dict)  # family -> its deployed graph
    tosa_node_max_error_lsb: float | None = None
    float_checks: FloatChecks | None = None  # int profile: the graphs against the float model

    def deployed_float(self, family: str) -> FloatCheck | None:
        """The graph a family deploys against the float model (its own, else model.tosa's), None unmeasured."""
        return self.float_checks.for_family(family) if self.float_checks is not None else None

    def deployed_error(self, family: str) -> float | None:
        """Max LSB error of the graph a family really runs (its partitions or own lowering, else model.tosa)."""
        own = self.partitioned.get(family)
        return own.max_error_lsb if own is not None else self.tosa_max_error_lsb

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CheckRecord:
        return cls(d, int(d.get("samples") or 0), str(d.get("profile", "")), d.get("tosa_snr_db"),
                   d.get("tosa_max_error_lsb"), d.get("quant_snr_db"),
                   {f: PartitionedCheck.from_json(c) for f, c in (d.get("partitioned") or {}).items() if c},
                   d.get("tosa_node_max_error_lsb"),
                   FloatChecks.from_json(d["float_checks"]) if d.get("float_checks") else None)
