"""The progress bar's ETA against the time a cold build really took.

    python bench/eta.py [--specs kws digits anomaly_detection image_classification] [-n 1 2] [--save DIR]
    python bench/eta.py --replay DIR/*.json      # the estimators again on recorded runs

Builds the example specs cold (a scratch product repo, shared cache off) with each -n, recording every task
event of the progress display, then replays the events through two estimators: `before` (every stage not
seen yet at the mean of the stages seen, from the first finished task on; npubuild before issue 35) and
`now` (build/progress.StageProgress.eta: nothing until every stage with work left has finished a task in
this run; then the longer of the work left spread over the parallel tasks and the longest chain of
dependent tasks left). Prints, per run, the predicted total (elapsed + ETA) at the first estimate and at
10/25/50/75% of the build's real time, beside that real time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def record(repo: Path, jobs: int) -> tuple[list[list], list[tuple[float, str, str]], float]:
    """A cold build's plan ([name, stage, deps] per task, in order), its (seconds, task, state) events, and its
    wall time."""
    from npubuild.cli import main
    from npubuild.engine import progress

    events: list[tuple[float, str, str]] = []
    stages: list[list] = []
    original_init, original_mark = progress.StageProgress.__init__, progress.StageProgress.mark

    def init(self, plan):
        original_init(self, plan)
        stages.extend([name, t.stage, list(t.deps)] for name, t in plan.tasks.items())

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


def replay(stages: list[list], events: list[tuple[float, str, str]], total: float) -> dict[str, dict]:
    from npubuild.engine import progress

    clock = [0.0]
    real = progress.time.perf_counter
    progress.time.perf_counter = lambda: clock[0]
    try:
        plan = SimpleNamespace(tasks={n: SimpleNamespace(stage=s, deps=d) for n, s, d in stages}, builds=[0])
        p = progress.StageProgress(plan)
        p.now = lambda: clock[0]
        before = Before(p)
        out: dict[str, dict] = {"before": {}, "now": {}}
        marks = [("first", None), *((f"{q:.0%}", q * total) for q in (0.1, 0.25, 0.5, 0.75))]
        for t, name, state in events:
            clock[0] = t
            p.mark(name, state)
            for label, est in (("before", before.eta()), ("now", p.eta())):
                if est is None:
                    continue
                for mark, at in marks:
                    if mark not in out[label] and (at is None or t >= at):
                        out[label][mark] = t + est
                        out[label].setdefault("first_at", t)
        return out
    finally:
        progress.time.perf_counter = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--specs", nargs="*", default=["kws", "digits", "anomaly_detection", "image_classification"])
    ap.add_argument("-n", "--jobs", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--save", type=Path, help="keep each run's events here (eta-n<jobs>.json)")
    ap.add_argument("--replay", nargs="*", type=Path, help="recorded runs to replay instead of building")
    args = ap.parse_args()
    rows = []
    runs = [(json.loads(f.read_text()), f.stem) for f in args.replay or []]
    for run in runs:
        data, name = run
        est = replay(data["stages"], [tuple(e) for e in data["events"]], data["total"])
        for label in ("before", "now"):
            cells = [est[label].get(m) for m in ("first_at", "first", "10%", "25%", "50%", "75%")]
            rows.append(f"| {name} | {len(data['stages'])} | {data['total']:.1f} | {label} | "
                        + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    for jobs in [] if args.replay else args.jobs:
        with tempfile.TemporaryDirectory(prefix="npubuild-eta-") as tmp:
            repo = Path(tmp)
            (repo / "configs").mkdir()
            (repo / "dodo.py").write_text("# product repo marker\n")
            for s in args.specs:
                shutil.copy(ROOT / "configs" / f"{s}.yaml", repo / "configs")
            shutil.copytree(ROOT / "configs" / "models", repo / "configs" / "models")
            shutil.copytree(ROOT / "configs" / "data", repo / "configs" / "data")
            stages, events, total = record(repo, jobs)
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"eta-n{jobs}.json").write_text(json.dumps({"stages": stages, "events": events,
                                                                      "total": total}))
        est = replay(stages, events, total)
        for label in ("before", "now"):
            cells = [est[label].get(m) for m in ("first_at", "first", "10%", "25%", "50%", "75%")]
            rows.append(f"| {'+'.join(args.specs) if len(args.specs) < 3 else len(args.specs)} specs, -n {jobs} | {len(stages)} | {total:.1f} | {label} | "
                        + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    print(f"load average {os.getloadavg()[0]:.2f}; specs: {', '.join(args.specs)}; cold, shared cache off\n")
    print("| run | tasks | real s | estimator | first ETA at s | predicted total s then | at 10% | at 25% | "
          "at 50% | at 75% |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
