"""Reading a report.json back (`npubuild report`, the previous run's report beside a new one, baselines): a
file that is not a well-formed report is bad input, one line naming what is wrong."""

from __future__ import annotations

from pathlib import Path

from npubuild.errors import InputError
from npubuild.fileio import read_json


def load_report(path: Path) -> dict:
    if not path.is_file():
        raise InputError("no report.json: build first" if path.name == "report.json" else "file not found",
                         str(path))
    try:
        report = read_json(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"not a valid report: {exc}", str(path)) from None
    except RecursionError:  # json's C decoder recurses once per nesting level
        raise InputError("not a valid report: nested too deeply to be one", str(path)) from None
    if not isinstance(report, dict) or not isinstance(report.get("builds"), list):
        raise InputError("not a valid report: no 'builds' list", str(path))
    if not isinstance(report.get("versions"), dict):
        raise InputError("not a valid report: no 'versions' mapping", str(path))
    for i, entry in enumerate(report["builds"]):
        problem = entry_problem(entry)
        if problem is not None:
            raise InputError(f"not a valid report: builds[{i}] {problem}", str(path))
    return report


ENTRY_FIELDS = {"spec": str, "model": str, "target": str, "status": str, "metrics": dict, "stages": dict,
                "gates": list, "errors": list}


def entry_problem(entry) -> str | None:
    """What is missing or mistyped in one report entry (the fields the report, the comparison and JUnit read)."""
    if not isinstance(entry, dict):
        return "is not a mapping"
    for name, kind in ENTRY_FIELDS.items():
        if name not in entry:
            return f"has no '{name}'"
        if not isinstance(entry[name], kind):
            return f"'{name}' is not a {kind.__name__}"
    if not all(isinstance(g, dict) and {"name", "ok"} <= set(g) for g in entry["gates"]):
        return "has a gate without 'name' and 'ok'"
    if not all(isinstance(s, dict) and "status" in s for s in entry["stages"].values()):
        return "has a stage without 'status'"
    return None


def unreadable_metric(report: dict, thresholds: dict) -> str | None:
    """The first metric a baseline comparison reads (the shown ones and every threshold's) whose value is
    neither null (not measured) nor a finite number, named with its build; None if there is none. NaN compares
    false with everything, so a damaged baseline said `No regression.` and exit 0 (issue 34)."""
    import math

    from npubuild.report.regress import SHOWN, build_id

    for b in report["builds"]:
        for metric in dict.fromkeys((*SHOWN, *thresholds)):
            v = b["metrics"].get(metric)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return (f"build {build_id(b)}: metric {metric} is {str(v)[:40]!r}, not a finite number: the "
                        "comparison cannot use this report")
    return None
