"""vela stage: each NPU partition of the target's family compiled by Vela, pools checked, firmware written
(ethosu/vela.py). The integer profile only: Ethos-U runs integer graphs."""

from __future__ import annotations

from npubuild.config.load import Build
from npubuild.engine.stage import Chain, Stage, TaskSpec, run_of


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    if b.pipeline.profile != "int":
        return None
    lower = chain["lower"]
    return TaskSpec(f"{b.model_name}-{b.target.name}",
                    {"lower": lower.key, "target": b.target.model_dump(), "vela": b.vela.model_dump()},
                    {"io": lower.outputs["io"]},
                    {"ini": "system.ini", "summary": "summary.json"}, ("lower",))


STAGE = Stage("vela", "npubuild.ethosu.vela", ("ethos-u-vela",), plan, run_of("npubuild.ethosu.vela"))
