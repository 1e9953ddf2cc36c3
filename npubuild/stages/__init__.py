"""The stages of a build, in run order: each module here defines one `STAGE` (npubuild.build.stage.Stage).

A stage module is the glue between the build graph and the code that does the work: what the stage's
task reads and writes for a build (its `plan`), and which implementation module runs it. Planning imports
these modules only, so it stays light; the implementation (onnxruntime, the lowering, Vela) is imported
when a task runs. records.py is the typed contract between the stages (io.json).
"""

from __future__ import annotations

from npubuild.build.stage import Stage
from npubuild.stages import evaluate, fvp, importer, lower, npu_sim, quantize, report, tosa_check, vela

STAGES: tuple[Stage, ...] = tuple(m.STAGE for m in (importer, quantize, lower, tosa_check, vela, npu_sim, evaluate, fvp, report))
STAGE_NAMES: tuple[str, ...] = tuple(s.name for s in STAGES)
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
