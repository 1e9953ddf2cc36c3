"""Build progress: counts, an ETA and the builds that finished; drawn as a live table on a terminal (rich) or
as one line per event in CI logs (the session prints those).

The live display is cargo-like: an overall bar (`[=====>    ] 57/106 tasks, 12/27 builds, 3 failed, ETA 12 s`)
and the per-stage table with fixed column widths (so it does not jump as names come and go); the result line
of each finished build and each failure's one line are printed above it and stay when it goes.
"""

from __future__ import annotations

import time
from typing import IO

from npubuild.engine.plan import BuildPlan

STATES = ("running", "ran", "restored", "cached", "failed", "blocked")  # blocked: not run, an upstream task failed
BAR_WIDTH = 28
# The ETA waits for a measured time of every stage with work left: extrapolating an unseen stage from the
# seen ones (the mean of them, or a fixed share per stage) was 1.2-2.4x off at its first figure on the
# example builds, each stage's first task carrying start-up and one model's size (bench/eta.md).
RUNNING_WIDTH = 44  # the running column's fixed width; longer lists are cut with "+N"


def format_seconds(s: float) -> str:
    """`42 s`, `3 min 05 s`: ETA and elapsed time as people read them."""
    s = max(0, round(s))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


class StageProgress:
    """Per-stage counts of tasks running / ran / restored / cached / failed, the builds done, and an ETA."""

    def __init__(self, plan: BuildPlan):
        self.total = {s.name: 0 for s in plan.stages}
        for t in plan.tasks.values():
            self.total[t.stage] = self.total.get(t.stage, 0) + 1
        self.counts = {s: dict.fromkeys(STATES, 0) for s in self.total}
        self.running: dict[str, float] = {}
        self.start = time.perf_counter()
        self.tasks_total = len(plan.tasks)
        self.builds_total = len(plan.builds)
        self.builds_done = 0
        self.builds_failed = 0
        self._seconds: dict[str, list[float]] = {}  # stage -> durations of the tasks that ran here
        self._max_parallel = 1
        self._deps = {name: list(getattr(t, "deps", [])) for name, t in plan.tasks.items()}  # in the plan's order
        self._finished: set[str] = set()

    @staticmethod
    def stage_of(task_name: str) -> str:
        return task_name.split(":", 1)[0]

    def mark(self, task_name: str, state: str) -> None:
        stage = self.stage_of(task_name)
        if stage not in self.counts:
            return
        now = time.perf_counter()
        began = self.running.pop(task_name, None)
        if began is not None:
            self.counts[stage]["running"] -= 1
            if state in ("ran", "restored"):
                self._seconds.setdefault(stage, []).append(now - began)
        if state != "running":
            self._finished.add(task_name)
        if state == "running":
            self.running[task_name] = now
            self._max_parallel = max(self._max_parallel, len(self.running))
        self.counts[stage][state] += 1

    def build_finished(self, build_id: str, cause: str | None) -> None:
        self.builds_done += 1
        if cause is not None:
            self.builds_failed += 1

    @staticmethod
    def _done(c: dict[str, int]) -> int:
        return c["ran"] + c["restored"] + c["cached"] + c["failed"] + c["blocked"]

    @property
    def tasks_done(self) -> int:
        return sum(self._done(c) for c in self.counts.values())

    def eta(self) -> float | None:
        """Seconds left, once it can be said from this run's own figures: None until every stage with work
        left has finished a task here (the depth-first schedule finishes a first build early). Then each task
        left takes its stage's mean so far, and the time left is the longer of that work spread over the
        parallel tasks seen and the longest chain of dependent tasks left (a lower bound on any schedule; a
        model's TOSA check cannot start before its lowering, whatever the jobs)."""
        means = {s: sum(v) / len(v) for s, v in self._seconds.items() if v}
        pending = {s for s, total in self.total.items()
                   if total - self._done(self.counts[s]) > 0}
        if not pending or not pending <= set(means):
            return None
        now = time.perf_counter()

        def left_of(name: str) -> float:
            mean = means[self.stage_of(name)]
            began = self.running.get(name)
            return mean if began is None else max(0.0, mean - (now - began))

        todo = [n for n in self._deps if n not in self._finished]
        work = sum(left_of(n) for n in todo)
        finish: dict[str, float] = {}
        for n in todo:  # the plan's order is a topological one: a task's deps come before it
            finish[n] = max((finish.get(d, 0.0) for d in self._deps[n]), default=0.0) + left_of(n)
        return max(work / self._max_parallel, max(finish.values(), default=0.0))

    def bar(self) -> str:
        """`[=====>      ] 57/106 tasks, 12/27 builds, 3 failed, 41.2 s, ETA 12 s`"""
        done, total = self.tasks_done, max(1, self.tasks_total)
        filled = int(BAR_WIDTH * done / total)
        arrow = "=" * filled + (">" if filled < BAR_WIDTH else "")
        eta = self.eta()
        parts = [f"[{arrow:<{BAR_WIDTH}}] {done}/{self.tasks_total} tasks",
                 f"{self.builds_done}/{self.builds_total} builds"]
        if self.builds_failed:
            parts.append(f"{self.builds_failed} failed")
        parts.append(format_seconds(time.perf_counter() - self.start))
        if eta is not None and done < total:
            parts.append(f"ETA {format_seconds(eta)}")
        return ", ".join(parts)

    def table(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        t = Table(title=f"npubuild  {time.perf_counter() - self.start:6.1f} s", title_justify="left")
        widths = {"stage": 10, "done": 9, "ran": 5, "cached": 6, "restored": 8, "failed": 6}
        for col, width in widths.items():  # fixed: the counts never move as the running names come and go
            t.add_column(col, justify="left" if col == "stage" else "right", min_width=width, max_width=width,
                         no_wrap=True)
        t.add_column("running", min_width=RUNNING_WIDTH, max_width=RUNNING_WIDTH, no_wrap=True, overflow="ellipsis")
        now = time.perf_counter()
        for stage, total in self.total.items():
            if not total:
                continue
            c = self.counts[stage]
            done = self._done(c)
            names = [f"{n.split(':', 1)[1]} ({now - s:.0f}s)" for n, s in self.running.items()
                     if self.stage_of(n) == stage]
            t.add_row(stage, f"{done}/{total}", str(c["ran"]), str(c["cached"]), str(c["restored"]),
                      f"[red]{c['failed']}[/red]" if c["failed"] else "0", _fit(names, RUNNING_WIDTH))
        return Group(Text(self.bar()), t)


def _fit(names: list[str], width: int) -> str:
    """As many running task names as fit in `width`, then `+N` for the rest."""
    shown: list[str] = []
    for i, n in enumerate(names):
        rest = len(names) - i - 1
        candidate = ", ".join([*shown, n]) + (f" +{rest}" if rest else "")
        if len(candidate) > width and shown:
            return ", ".join(shown) + f" +{len(names) - len(shown)}"
        shown.append(n)
    return ", ".join(shown)


class LiveDisplay:
    """The rich live display, refreshed on every task event and a few times a second; `print` writes a line
    above it (a finished build's result) that stays when the display moves on."""

    def __init__(self, progress: StageProgress, out: IO[str]):
        from rich.console import Console
        from rich.live import Live

        self.progress = progress
        # on a terminal the table goes when the run ends, leaving the result lines and the closing summary (a
        # no-op build: that one line, as cargo leaves its finished line and not its progress bar); a log
        # (--progress live into a file) keeps its last frame
        console = Console(file=out)
        self.live = Live(get_renderable=progress.table, console=console, refresh_per_second=4,
                         transient=console.is_terminal)
        self.live.start()

    def update(self) -> None:
        self.live.refresh()

    def print(self, text: str, style: str | None = None) -> None:
        from rich.text import Text

        self.live.console.print(Text(text, style=style or ""), soft_wrap=True)

    def stop(self) -> None:
        self.live.stop()
        if not self.live.console.is_terminal:  # rich ends the last frame without a newline off a terminal
            self.live.console.line()
