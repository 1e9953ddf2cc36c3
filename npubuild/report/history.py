"""A small store of past runs' reports, for trends across nights (not just one baseline).

`npubuild report --history DIR` adds this run's report to DIR (one `<created>-<run id>.json` per run,
slimmed to each build's status and scalar metrics: per-layer tables and placements are what the run's
own report.json is for) and keeps the newest `keep`; the HTML draws one trend chart per metric from them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from npubuild.fileio import write_text
from npubuild.report.regress import build_id

KEEP = 30
TREND_METRICS = ("inference_ms", "npu_cycles", "sram_kib", "offchip_kib", "tosa_snr_db", "accuracy")


def slim(report: dict) -> dict:
    """What the history keeps of a report: the run, tool versions, and per build its status and numbers."""
    builds = []
    for b in report.get("builds", []):
        metrics = {k: v for k, v in (b.get("metrics") or {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        builds.append({"spec": b["spec"], "model": b["model"], "target": b["target"], "status": b["status"],
                       "metrics": metrics})
    return {k: report.get(k) for k in ("run_id", "created", "commit", "versions")} | {"builds": builds}


def _file_name(report: dict) -> str:
    created = re.sub(r"[^0-9T]", "", str(report.get("created") or ""))[:15] or "unknown"
    run = re.sub(r"[^A-Za-z0-9_.-]", "_", str(report.get("run_id") or "run"))
    return f"{created}-{run}.json"


def load(directory: Path) -> list[dict]:
    """The stored runs, oldest first (unreadable files are skipped: the history is a convenience)."""
    runs = []
    for f in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("builds"), list):
            runs.append(data)
    return sorted(runs, key=lambda r: (str(r.get("created") or ""), str(r.get("run_id") or "")))


def record(directory: Path, report: dict, keep: int = KEEP) -> list[dict]:
    """Add `report` (once per run id) and drop all but the newest `keep`; returns the runs, oldest first."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / _file_name(report)
    if not path.exists():
        write_text(path, json.dumps(slim(report)) + "\n")
    files = sorted(directory.glob("*.json"))
    for old in files[:max(0, len(files) - keep)]:
        old.unlink()
    return load(directory)


def series(runs: list[dict], metric: str) -> list[tuple[str, list[float | None]]]:
    """Per build (in the last run's order, then any older ones): the metric in each run, None where absent."""
    order: dict[str, None] = {}
    for run in reversed(runs):
        for b in run["builds"]:
            order.setdefault(build_id(b), None)
    table = []
    for bid in order:
        values: list[float | None] = []
        for run in runs:
            entry = next((b for b in run["builds"] if build_id(b) == bid), None)
            v = (entry or {}).get("metrics", {}).get(metric)
            values.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None)
        if any(v is not None for v in values):
            table.append((bid, values))
    return table


def moved(values: list[float | None]) -> bool:
    """Whether a build's metric changed over the runs: another value, or one that came or went (a build
    that failed, or was added, in some of them)."""
    present = [v for v in values if v is not None]
    return len(set(present)) > 1 or (bool(present) and len(present) < len(values))


def run_labels(runs: list[dict]) -> list[str]:
    """Short x-axis labels: the run's date and time (`11-03 02:00`, with seconds if two runs share a
    minute), else its id."""
    created = [str(r.get("created") or "") for r in runs]
    width = 19 if len({c[:16] for c in created}) < len(created) else 16
    return [f"{c[5:10]} {c[11:width]}" if len(c) >= 16 else str(r.get("run_id") or "?")[:15]
            for c, r in zip(created, runs, strict=True)]
