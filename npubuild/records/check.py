"""The tosa-check stage's numerics.json, written and read through `CheckRecord`: the TOSA graph's error against
the model it is held to, per family the deployed (partitioned or own-lowered) graph's, the per-node check, and
per family the deployed graph against the float model (records/accuracy.py; the evaluation set's accuracy is
the evaluate stage's: records/evaluate.py).

The file's top-level keys are names the report's metric table reads (config/metrics.py: a metric's
`source_key`); the per-output comparisons, the I/O summary and the per-node check are the verify package's
JSON, carried as it wrote them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from npubuild.records.accuracy import FloatCheck, FloatChecks
from npubuild.records.lower import PartitionedCheck


class Checked(StrEnum):
    """What the check ran where there is no single TOSA graph."""

    PARTITIONED = "partitioned"  # nodes no lowering takes: the portable split (host partitions on onnxruntime)
    HOST_ONLY = "host only"  # no NPU partition: onnxruntime against itself, so no TOSA figure


@dataclass(frozen=True)
class CheckRecord:
    """numerics.json. The error figures are None for an FP pipeline's check (no integers, no LSB)."""

    samples: int
    profile: str  # int or fp
    tosa_snr_db: float | None  # the worst output's, against the model it is held to
    tosa_max_error_lsb: float | None
    quant_snr_db: float | None  # against the float model
    tosa_mean_error_lsb: float | None = None
    tosa_worst_output: str | None = None
    tosa_cosine: float | None = None
    outputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per output: verify.numerics' figures
    io: Mapping[str, Any] = field(default_factory=dict)  # the graph's inputs and outputs as deployed
    node_errors: Mapping[str, Any] | None = None  # the per-node check (verify/node_errors.py), None if not run
    node_check: str | None = None  # whether the per-node check ran, and why (an integer check's)
    checked: Checked | None = None  # not the one TOSA graph (None): the portable split, or nothing of TOSA
    # family -> its deployed graph's check (an integer check's; None for FP)
    partitioned: Mapping[str, PartitionedCheck] | None = None
    float_checks: FloatChecks | None = None  # an integer check's: the graphs against the float model

    def deployed_float(self, family: str) -> FloatCheck | None:
        """The graph a family deploys against the float model (its own, else model.tosa's), None unmeasured."""
        return self.float_checks.for_family(family) if self.float_checks is not None else None

    @property
    def tosa_worst_node(self) -> Mapping[str, Any] | None:
        return self.node_errors.get("worst") if self.node_errors is not None else None

    @property
    def tosa_node_max_error_lsb(self) -> float | None:
        worst = self.tosa_worst_node
        return worst["max_error_lsb"] if worst else None

    def deployed_error(self, family: str) -> float | None:
        """Max LSB error of the graph a family really runs (its partitions or own lowering, else model.tosa)."""
        own = (self.partitioned or {}).get(family)
        return own.max_error_lsb if own is not None else self.tosa_max_error_lsb

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "samples": self.samples, "profile": self.profile, "tosa_snr_db": self.tosa_snr_db,
            "tosa_max_error_lsb": self.tosa_max_error_lsb, "tosa_mean_error_lsb": self.tosa_mean_error_lsb,
            "tosa_worst_output": self.tosa_worst_output, "tosa_cosine": self.tosa_cosine,
            "quant_snr_db": self.quant_snr_db, "outputs": self.outputs, "io": self.io}
        if self.node_check is not None:
            d["node_check"] = self.node_check
        if self.node_errors is not None:
            d.update(tosa_node_max_error_lsb=self.tosa_node_max_error_lsb, tosa_worst_node=self.tosa_worst_node,
                     node_errors=self.node_errors)
        if self.checked is not None:
            d["checked"] = self.checked.value
        if self.partitioned is not None:
            d["partitioned"] = {fam: c.to_json() for fam, c in self.partitioned.items()}
        if self.float_checks is not None:
            d["float_checks"] = self.float_checks.to_json()
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CheckRecord:
        """Read numerics.json (or the tosa-check stage's metrics; {} where the stage did not run)."""
        partitioned = d.get("partitioned")
        return cls(int(d.get("samples") or 0), str(d.get("profile", "")), d.get("tosa_snr_db"),
                   d.get("tosa_max_error_lsb"), d.get("quant_snr_db"), d.get("tosa_mean_error_lsb"),
                   d.get("tosa_worst_output"), d.get("tosa_cosine"), d.get("outputs") or {}, d.get("io") or {},
                   d.get("node_errors"), d.get("node_check"), Checked(d["checked"]) if d.get("checked") else None,
                   None if partitioned is None else
                   {f: PartitionedCheck.from_json(c) for f, c in partitioned.items() if c},
                   FloatChecks.from_json(d["float_checks"]) if d.get("float_checks") else None)
