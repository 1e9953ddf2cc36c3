"""Where the lower stage's time goes on one QDQ model: the lowerings, the partition planning, and the
TOSA reference-model runs of the partition check, each timed; then the whole stage.

    PYTHONPATH=. python bench/lower_stage.py path/to/model_qdq.onnx [--repeat 1]

Prints a table (seconds). The model is a quantize stage's output (build/stages/quantize/*/model_qdq.onnx).
Measured figures are in bench/lower_stage.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from npubuild.config.accelerator import LOWERING_FAMILIES
from npubuild.ethosu import families
from npubuild.ethosu.partition import plan_partitions
from npubuild.lowering.driver import lower_model
from npubuild.tosa.run import run_tosa

DEFAULT_PASSES = ["eliminate_identity", "eliminate_dropout", "remove_unused", "topological_sort"]  # pipelines/default.yaml


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _count_reference_runs() -> list[int]:
    """Count the stage's TOSA reference-model runs (the partition check's) by wrapping the function it calls."""
    from npubuild.verify import partitioned

    count = [0]
    inner = partitioned.run_tosa

    def counted(*args, **kwargs):
        count[0] += 1
        return inner(*args, **kwargs)

    partitioned.run_tosa = counted  # this process only: a benchmark, never a test
    return count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    args = ap.parse_args()
    model = onnx.load(str(args.model))
    rows = []
    lowered, t = _timed(lambda: lower_model(model, "int"))
    rows.append(("lower_model (portable)", t))
    own = 0
    for fam in LOWERING_FAMILIES:
        fam_lowered, t = _timed(lambda fam=fam: lower_model(model, "int", family=fam))
        rows.append((f"lower_model ({fam})", t))
        _, t = _timed(lambda fam=fam, fl=fam_lowered: plan_partitions(model, fl, fam))
        rows.append((f"plan_partitions ({fam})", t))
        own += fam_lowered.tosa != lowered.tosa
    rng = np.random.default_rng(0)
    feeds = {s.onnx_name: rng.uniform(-1, 1, s.onnx_shape).astype(np.float32) for s in lowered.inputs}
    _, t = _timed(lambda: run_tosa(lowered.tosa, lowered, feeds))
    rows.append(("one TOSA reference-model run", t))
    rows.append((f"families with their own lowering: {own}", 0.0))
    runs = _count_reference_runs()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        _, t = _timed(lambda: families.lower_stage(args.model, DEFAULT_PASSES, "int", LOWERING_FAMILIES,
                                                   out / "io.json"))
        rows.append(("whole lower stage (families.lower_stage)", t))
    rows.append((f"TOSA reference-model runs in the stage: {runs[0]}", 0.0))
    width = max(len(r[0]) for r in rows)
    print(f"{'step':<{width}}  seconds")
    for name, secs in rows:
        print(f"{name:<{width}}  {secs:7.2f}")


if __name__ == "__main__":
    main()
