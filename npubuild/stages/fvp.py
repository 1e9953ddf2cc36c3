"""fvp stage: the Vela model on a Corstone FVP with the user's runner (ethosu/fvp.py), where both exist.

Whether a build gets an FVP run is decided here, at plan time (ethosu/fvp_select.py): the FVP binary and
runner are found or the stage is skipped with the reason (`verify.fvp: auto`), or planned to fail with it
(`required`). The binary's size and mtime are part of the task's config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npubuild.config.schema import FvpOptions
from npubuild.engine.stage import Chain, Stage, StageTask, TaskSpec
from npubuild.records.build import Skip

if TYPE_CHECKING:
    from npubuild.config.load import Build


@dataclass(frozen=True)
class FvpConfig:
    """The fvp task's config (its key). `error`: `verify.fvp: required` cannot be met, and the task fails with
    it (its config is then that alone); else the platform, the accelerator family and MAC count, the spec's fvp
    options with the FVP executable found, the binary's size and mtime, the mode, and the upstream keys."""

    error: str | None
    platform: str = ""
    family: str = ""
    macs: int = 0
    fvp: FvpOptions = field(default_factory=FvpOptions)
    fvp_binary: Mapping[str, int] = field(default_factory=dict)
    mode: str = "auto"
    vela_key: str | None = None
    tosa_check_key: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.error:
            return {"error": self.error}
        d: dict[str, Any] = {"platform": self.platform, "family": self.family, "macs": self.macs,
                             "fvp": self.fvp.model_dump(), "fvp_binary": dict(self.fvp_binary), "error": None,
                             "mode": self.mode}
        if self.vela_key is not None:
            d.update(vela=self.vela_key, tosa_check=self.tosa_check_key)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FvpConfig:
        if d.get("error"):
            return cls(d["error"])
        return cls(None, d["platform"], d["family"], d["macs"], FvpOptions.model_validate(d["fvp"]),
                   d["fvp_binary"], d["mode"], d.get("vela"), d.get("tosa_check"))


def plan(b: Build, chain: Chain) -> TaskSpec | Skip:
    from npubuild.ethosu.fvp_select import fvp_decision

    decision, runner, reason = fvp_decision(b)
    if decision is None:
        return Skip(reason or "not run")
    config = FvpConfig.from_json(decision)
    inputs = {}
    if config.error is None:
        vela, check = chain["vela"], chain["tosa-check"]
        inputs = {"vela_summary": vela.outputs["summary"], "io": check.inputs["io"],
                  "reference": check.outputs["reference"], "runner": runner}
        config = replace(config, vela_key=vela.key, tosa_check_key=check.key)
    deps = tuple(s for s in ("vela", "tosa-check") if s in chain)
    return TaskSpec(f"{b.model_name}-{b.target.name}", config.to_json(), inputs, {"log": "uart.log", "result": "fvp.json"},
                    deps)


def run(task: StageTask) -> dict:
    from npubuild.errors import StageError
    from npubuild.ethosu.fvp import FvpFiles, FvpSetup, run_on_fvp

    config = FvpConfig.from_json(task.config)
    if config.error:
        raise StageError(config.error)
    setup = FvpSetup(config.platform, config.macs, Path(config.fvp.executable or ""), config.fvp,
                     config.mode == "required")
    files = FvpFiles(task.inputs["vela_summary"], task.inputs["io"], task.inputs["reference"], task.inputs["runner"])
    return run_on_fvp(setup, files, task.dir, task.outputs["log"], task.outputs["result"])


STAGE = Stage("fvp", __name__, "npubuild.ethosu.fvp", (), plan, run)
