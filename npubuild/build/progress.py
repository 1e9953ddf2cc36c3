"""Build progress: a live per-stage table on a terminal (rich), one line per task elsewhere (CI logs)."""

from __future__ import annotations

import time
from typing import IO

from npubuild.build.plan import BuildPlan
from npubuild.stages import STAGE_NAMES

STATES = ("running", "ran", "cached", "failed")


class StageProgress:
    """Per-stage counts of tasks running / ran / cached / failed, and which tasks are running now."""

    def __init__(self, plan: BuildPlan):
        self.total = {s: 0 for s in STAGE_NAMES}
        for t in plan.tasks.values():
            self.total[t.stage] = self.total.get(t.stage, 0) + 1
        self.counts = {s: dict.fromkeys(STATES, 0) for s in self.total}
        self.running: dict[str, float] = {}
        self.start = time.perf_counter()

    @staticmethod
    def stage_of(task_name: str) -> str:
        return task_name.split(":", 1)[0]

    def mark(self, task_name: str, state: str) -> None:
        stage = self.stage_of(task_name)
        if stage not in self.counts:
            return
        if task_name in self.running:
            del self.running[task_name]
            self.counts[stage]["running"] -= 1
        if state == "running":
            self.running[task_name] = time.perf_counter()
        self.counts[stage][state] += 1

    def table(self):
        from rich.table import Table

        t = Table(title=f"npubuild  {time.perf_counter() - self.start:6.1f} s", title_justify="left")
        for col in ("stage", "done", "ran", "cached", "failed", "running"):
            t.add_column(col, justify="left" if col in ("stage", "running") else "right")
        now = time.perf_counter()
        for stage, total in self.total.items():
            if not total:
                continue
            c = self.counts[stage]
            done = c["ran"] + c["cached"] + c["failed"]
            names = [f"{n.split(':', 1)[1]} ({now - s:.0f}s)" for n, s in self.running.items()
                     if self.stage_of(n) == stage]
            shown = ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "")
            t.add_row(stage, f"{done}/{total}", str(c["ran"]), str(c["cached"]),
                      f"[red]{c['failed']}[/red]" if c["failed"] else "0", shown)
        return t


class LiveDisplay:
    """The rich live table, refreshed on every task event and a few times a second."""

    def __init__(self, progress: StageProgress, out: IO[str]):
        from rich.console import Console
        from rich.live import Live

        self.progress = progress
        self.live = Live(get_renderable=progress.table, console=Console(file=out), refresh_per_second=4,
                         transient=False)
        self.live.start()

    def update(self) -> None:
        self.live.refresh()

    def stop(self) -> None:
        self.live.stop()
        if not self.live.console.is_terminal:  # rich ends the last frame without a newline off a terminal
            self.live.console.line()
