"""`npubuild report`: print a build directory's report; with --baseline, deltas and regressions.

Exit 1 if a build failed or, with a baseline, any metric regressed past its
threshold (each regression named on stderr); 2 for a missing or bad file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from npubuild.errors import InputError


def load_report(path: Path) -> dict:
    from npubuild.fileio import read_json

    if not path.is_file():
        raise InputError("no report.json: build first" if path.name == "report.json" else "file not found",
                         str(path))
    try:
        report = read_json(path)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"not a valid report: {exc}", str(path)) from None
    if not isinstance(report, dict) or not isinstance(report.get("builds"), list):
        raise InputError("not a valid report: no 'builds' list", str(path))
    if not isinstance(report.get("versions"), dict):
        raise InputError("not a valid report: no 'versions' mapping", str(path))
    for i, entry in enumerate(report["builds"]):
        problem = _entry_problem(entry)
        if problem is not None:
            raise InputError(f"not a valid report: builds[{i}] {problem}", str(path))
    return report


ENTRY_FIELDS = {"spec": str, "model": str, "target": str, "status": str, "metrics": dict, "stages": dict,
                "gates": list, "errors": list}


def _entry_problem(entry) -> str | None:
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


def cmd_report(args) -> int:
    from npubuild.config.load import find_project_root
    from npubuild.report.junit import write_junit
    from npubuild.report.regress import compare, load_thresholds, render_comparison
    from npubuild.report.summary import render_markdown, write_html

    build_dir = Path(args.build_dir)
    report = load_report(build_dir / "report.json")
    comparison = None
    text = render_markdown(report)
    if args.baseline:
        baseline = load_report(Path(args.baseline))
        thresholds = load_thresholds(Path(args.thresholds) if args.thresholds else None,
                                     find_project_root(Path.cwd()))
        comparison = compare(report, baseline, thresholds)
        text += "\n" + render_comparison(comparison, args.baseline)
    print(text, end="")
    write_html(build_dir / "report.html", report, comparison, baseline=args.baseline,
               cache_dir=build_dir / ".cache" / "plots")
    if args.junit:
        write_junit(Path(args.junit), report, comparison)
    failed = [b for b in report["builds"] if b["status"] != "passed"]
    for r in comparison.regressions if comparison else []:
        print(f"regression: {r.line()}", file=sys.stderr)
    return 1 if failed or (comparison and comparison.regressions) else 0


def register(sub) -> None:
    r = sub.add_parser("report", help="print the report of a build directory, compare with a baseline")
    r.add_argument("--build-dir", default="build")
    r.add_argument("--baseline", help="an earlier run's report.json: show deltas, exit 1 on regressions")
    r.add_argument("--thresholds", help="regression thresholds YAML (default: <project>/regressions.yaml)")
    r.add_argument("--junit", help="write JUnit XML here (one testcase per build and per gate)")
    r.set_defaults(func=cmd_report)
