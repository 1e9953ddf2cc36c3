"""fvp stage: the Vela model on a Corstone FVP with the user's runner (ethosu/fvp.py), where both exist.

Whether a build gets an FVP run is decided here, at plan time (ethosu/fvp_select.py): the FVP binary and
runner are found or the stage is skipped with the reason (`verify.fvp: auto`), or planned to fail with it
(`required`). The binary's size and mtime are part of the task's config.
"""

from __future__ import annotations

from npubuild.config.load import Build
from npubuild.engine.stage import Chain, Skip, Stage, TaskSpec, run_of


def plan(b: Build, chain: Chain) -> TaskSpec | Skip:
    from npubuild.ethosu.fvp_select import fvp_decision

    config, runner, reason = fvp_decision(b)
    if config is None:
        return Skip(reason or "not run")
    inputs = {}
    if not config.get("error"):
        vela, check = chain["vela"], chain["tosa-check"]
        inputs = {"vela_summary": vela.outputs["summary"], "io": check.inputs["io"],
                  "reference": check.outputs["reference"], "runner": runner}
        config = {**config, "vela": vela.key, "tosa_check": check.key}
    deps = tuple(s for s in ("vela", "tosa-check") if s in chain)
    return TaskSpec(f"{b.model_name}-{b.target.name}", config, inputs, {"log": "uart.log", "result": "fvp.json"}, deps)


STAGE = Stage("fvp", "npubuild.ethosu.fvp", (), plan, run_of("npubuild.ethosu.fvp"))
