"""early-fit stage: the imported model's lower bounds of arena and constants against the pools of every
target it is compiled for (ethosu/early_fit.py). When not one target can hold them it fails now, with the
pool check's own line, before quantisation, tosa-check and Vela spend minutes on a model that cannot fit.
One task per imported model and INT pipeline, shared by its builds; the quantize stage waits for it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec
from npubuild.ethosu.pools import TargetPools

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class EarlyFitConfig:
    """The task's config (its key): the import task's key and the pools of the targets of every build sharing
    it (`targets`: merged over those builds by the plan, TaskSpec.union)."""

    import_key: str
    targets: tuple[TargetPools, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Without `targets`: the plan writes their union over the builds."""
        return {"import": self.import_key}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EarlyFitConfig:
        return cls(d["import"], tuple(TargetPools.from_json(t) for t in d.get("targets", ())))


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    if b.pipeline.profile != "int":  # no Vela stage: nothing to fit
        return None
    imp = chain["import"]
    return TaskSpec(b.model_name, EarlyFitConfig(imp.key).to_json(), {"onnx": imp.outputs["onnx"]}, {}, ("import",),
                    union={"targets": (TargetPools.of(b.target).to_json(),)})


def run(task: StageTask) -> dict:
    from npubuild.ethosu.early_fit import check_fit

    config = EarlyFitConfig.from_json(task.config)
    return check_fit(task.inputs["onnx"], config.targets)


STAGE = Stage("early-fit", __name__, "npubuild.ethosu.early_fit", ("onnx",), plan, run)
