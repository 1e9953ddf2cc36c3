"""vela stage: each NPU partition of the target's family compiled by Vela, pools checked, firmware written
(ethosu/vela.py). The integer profile only: Ethos-U runs integer graphs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npubuild.config.schema import TargetProfile, VelaOptions
from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class VelaConfig:
    """The vela task's config (its key): the lower task's key, the target profile and its Vela options."""

    lower_key: str
    target: TargetProfile
    vela: VelaOptions

    def to_json(self) -> dict[str, Any]:
        return {"lower": self.lower_key, "target": self.target.model_dump(), "vela": self.vela.model_dump()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> VelaConfig:
        return cls(d["lower"], TargetProfile.model_validate(d["target"]), VelaOptions.model_validate(d["vela"]))


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    if b.pipeline.profile != "int":
        return None
    lower = chain["lower"]
    return TaskSpec(f"{b.model_name}-{b.target.name}", VelaConfig(lower.key, b.target, b.vela).to_json(),
                    {"io": lower.outputs["io"]}, {"ini": "system.ini", "summary": "summary.json"}, ("lower",))


def run(task: StageTask) -> dict:
    from npubuild.ethosu.vela import compile_model
    from npubuild.ethosu.vela_cache import for_stage_dir

    config = VelaConfig.from_json(task.config)
    return compile_model(task.inputs["io"], config.target, config.vela, task.dir, task.outputs["ini"],
                         task.outputs["summary"], for_stage_dir(task.dir))


STAGE = Stage("vela", __name__, "npubuild.ethosu.vela", ("ethos-u-vela",), plan, run)
