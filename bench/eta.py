"""The progress bar's ETA against the time a cold build really took.

    python bench/eta.py [--specs kws digits anomaly_detection image_classification] [-n 1 2]

Builds the example specs cold (a scratch product repo, shared cache off) with each -n, recording every task
event of the progress display, then replays the events through two estimators: `before` (every stage not
seen yet at the mean of the stages seen, from the first finished task on; npubuild before issue 35) and
`now` (build/progress.StageProgress.eta: nothing until a stage that scales with the model has finished a
task, unseen stages at their STAGE_WEIGHTS share). Prints, per run, the predicted total (elapsed + ETA) at
the first estimate and at 10/25/50/75% of the build's real time, beside that real time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def record(repo: Path, jobs: int) -> tuple[list[str], list[tuple[float, str, str]], float]:
    """A cold build's plan stages and (seconds, task, state) events, and its wall time."""
    from npubuild.build import progress
    from npubuild.cli import main

    events: list[tuple[float, str, str]] = []
    stages: list[str] = []
    original_init, original_mark = progress.StageProgress.__init__, progress.StageProgress.mark

    def init(self, plan):
        original_init(self, plan)
        stages.extend(t.stage for t in plan.tasks.values())

    def mark(self, name, state):
        original_mark(self, name, state)
        events.append((time.perf_counter() - self.start, name, state))

    progress.StageProgress.__init__, progress.StageProgress.mark = init, mark
    try:
        cwd = Path.cwd()
        os.chdir(repo)
        start = time.perf_counter()
        main(["build", "-q", "--cache", "off", "-n", str(jobs), "--build-dir", "build"])
        total = time.perf_counter() - start
    finally:
        os.chdir(cwd)
        progress.StageProgress.__init__, progress.StageProgress.mark = original_init, original_mark
    return stages, events, total


class Before:
    """The estimator npubuild had: unseen stages at the mean of the seen ones, from the first task on."""

    def __init__(self, progress):
        self.p = progress

    def eta(self) -> float | None:
        p = self.p
        means = {s: sum(v) / len(v) for s, v in p._seconds.items() if v}
        if not means:
            return None
        overall = sum(means.values()) / len(means)
        now = p.now()
        left = sum((total - (p._done(p.counts[s]) + p.counts[s]["running"])) * means.get(s, overall)
                   for s, total in p.total.items())
        left += sum(max(0.0, means.get(p.stage_of(n), overall) - (now - b)) for n, b in p.running.items())
        return left / p._max_parallel


def replay(stages: list[str], events: list[tuple[float, str, str]], total: float) -> dict[str, dict]:
    from npubuild.build import progress

    clock = [0.0]
    real = progress.time.perf_counter
    progress.time.perf_counter = lambda: clock[0]
    try:
        plan = SimpleNamespace(tasks={f"{s}:{i}": SimpleNamespace(stage=s) for i, s in enumerate(stages)}, builds=[0])
        p = progress.StageProgress(plan)
        p.now = lambda: clock[0]
        before = Before(p)
        names: dict[str, str] = {}
        free = {s: [k for k in plan.tasks if k.startswith(f"{s}:")] for s in set(stages)}
        out: dict[str, dict] = {"before": {}, "now": {}}
        marks = [("first", None), *((f"{q:.0%}", q * total) for q in (0.1, 0.25, 0.5, 0.75))]
        for t, name, state in events:
            clock[0] = t
            if name not in names:
                names[name] = free[name.split(":", 1)[0]].pop(0)
            p.mark(names[name], state)
            for label, est in (("before", before.eta()), ("now", p.eta())):
                if est is None:
                    continue
                for mark, at in marks:
                    if mark not in out[label] and (at is None or t >= at):
                        out[label][mark] = t + est
        return out
    finally:
        progress.time.perf_counter = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specs", nargs="*", default=["kws", "digits", "anomaly_detection", "image_classification"])
    ap.add_argument("-n", "--jobs", nargs="*", type=int, default=[1, 2])
    args = ap.parse_args()
    rows = []
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory(prefix="npubuild-eta-") as tmp:
            repo = Path(tmp)
            (repo / "configs").mkdir()
            (repo / "dodo.py").write_text("# product repo marker\n")
            for s in args.specs:
                shutil.copy(ROOT / "configs" / f"{s}.yaml", repo / "configs")
            shutil.copytree(ROOT / "configs" / "models", repo / "configs" / "models")
            shutil.copytree(ROOT / "configs" / "data", repo / "configs" / "data")
            stages, events, total = record(repo, jobs)
        est = replay(stages, events, total)
        for label in ("before", "now"):
            cells = [est[label].get(m) for m in ("first", "10%", "25%", "50%", "75%")]
            rows.append(f"| -n {jobs} | {len(stages)} | {total:.1f} | {label} | "
                        + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    print(f"load average {os.getloadavg()[0]:.2f}; specs: {', '.join(args.specs)}; cold, shared cache off\n")
    print("| jobs | tasks | real s | estimator | predicted total s at first ETA | at 10% | at 25% | at 50% | at 75% |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
