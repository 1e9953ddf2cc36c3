"""The stages of a build, in run order: each module here is one stage, in one place.

A stage module holds the stage's `plan` (what its task reads and writes for a build), its frozen config record
(the task's config, so its cache key, written as it has been), its `run` (the adapter from the task's paths
and config to the typed implementation function, imported inside `run` so that planning stays light) and
its `STAGE` (npubuild.engine.stage.Stage). The implementations stay where their domain is (the lowering,
Vela, npu-sim...); the engine is handed STAGES by its caller (the commands, npubuild.dodo_namespace).
The typed records between the stages are npubuild/records/.
"""

from __future__ import annotations

from npubuild.engine.stage import Stage
from npubuild.stages import (
    early_fit,
    evaluate,
    fvp,
    importer,
    lower,
    npu_sim,
    precision,
    quantize,
    report,
    tosa_check,
    vela,
)

STAGES: tuple[Stage, ...] = tuple(m.STAGE for m in (importer, early_fit, quantize, precision, lower, tosa_check, vela,
                                                    npu_sim, evaluate, fvp, report))
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
