"""report stage (one per build): the stages' metrics gathered into the report's metrics and the gates checked
(report/metrics.py). Never in the shared cache: it reads this build dir's records."""

from __future__ import annotations

from npubuild.build.stage import Chain, Stage, TaskSpec, run_of
from npubuild.config.load import Build


def plan(b: Build, chain: Chain) -> TaskSpec:
    return TaskSpec(f"{b.spec.name}/{b.model_name}/{b.target.name}",
                    {"build": b.id, "expect": b.expect, "default_gates": list(b.default_gates),
                     "stages": {s: t.key for s, t in chain.items()}},
                    {s: t.outputs["record"] for s, t in chain.items()}, {"entry": "entry.json"}, tuple(chain))


STAGE = Stage("report", "npubuild.report.metrics", (), plan, run_of("npubuild.report.metrics"), per_build=True)
