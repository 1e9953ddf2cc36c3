"""report stage (one per build): the stages' metrics gathered into the report's metrics and the gates checked
(report/metrics.py). Never in the shared cache: it reads this build dir's records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class ReportConfig:
    """The report task's config (its key): the build and its accelerator, its gates (config/load.Build.expect: the
    profile's and pipeline's defaults under the spec's `expect`), its stages' keys, which gates are defaults
    (evaluated only where their metric was measured: config/gates.py), and below what npu_offload its pipeline
    warns that the host does most of the work."""

    build: str
    accelerator: str
    expect: Mapping[str, Any]
    stages: Mapping[str, str]  # stage name -> its task's key
    default_gates: tuple[str, ...] = ()
    warn_below_npu_offload: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"build": self.build, "accelerator": self.accelerator, "expect": dict(self.expect),
                "stages": dict(self.stages), "default_gates": list(self.default_gates),
                "warn_below_npu_offload": self.warn_below_npu_offload}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ReportConfig:
        return cls(d["build"], d["accelerator"], d["expect"], d["stages"], tuple(d.get("default_gates", ())),
                   d.get("warn_below_npu_offload"))


def plan(b: Build, chain: Chain) -> TaskSpec:
    config = ReportConfig(b.id, b.target.accelerator, b.expect, {s: t.key for s, t in chain.items()},
                          b.default_gates, b.pipeline.warn_below_npu_offload)
    return TaskSpec(f"{b.spec.name}/{b.model_name}/{b.target.name}", config.to_json(),
                    {s: t.outputs["record"] for s, t in chain.items()}, {"entry": "entry.json"}, tuple(chain))


def run(task: StageTask) -> dict:
    from npubuild.report.metrics import build_entry

    config = ReportConfig.from_json(task.config)
    return build_entry(task.inputs, config.accelerator, config.expect, task.outputs["entry"], config.default_gates,
                       config.warn_below_npu_offload)


STAGE = Stage("report", __name__, "npubuild.report.metrics", (), plan, run, per_build=True, cached=False)
