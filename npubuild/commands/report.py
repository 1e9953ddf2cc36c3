"""`npubuild report`: print a build directory's report; with --baseline, deltas and regressions.

Exit 1 if a build failed or, with a baseline, any metric regressed past its threshold, a build that
passed there fails now, or a build of the baseline is missing from this run while its selection asked
for it (each regression named on stderr); 2 for a missing or bad file. `--history DIR` keeps a small
store of past runs and draws a trend chart per metric in report.html.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from npubuild.commands import add_build_dir, build_dir_of
from npubuild.errors import DiskFull, InputError, is_disk_full


def summary_text(report: dict, build_dir: Path) -> str:
    """What `report` prints before the baseline section: the counts, one line per build that did not pass with
    its cause, and where the full reports are (report.md has every table; `--markdown` prints it)."""
    from npubuild.report.brief import failure_cause
    from npubuild.report.regress import build_id
    from npubuild.report.status import Status, passed

    builds = report["builds"]
    counts = {s: sum(1 for b in builds if b["status"] == s) for s in Status}
    hosted = counts[Status.HOST_ONLY] + counts[Status.MOSTLY_HOST]
    host_note = f" ({counts[Status.HOST_ONLY]} host only, {counts[Status.MOSTLY_HOST]} mostly host)" if hosted else ""
    lines = [f"{len(builds)} builds: {counts[Status.PASSED] + hosted} passed{host_note}, {counts[Status.FAILED]} "
             f"failed, {counts[Status.SKIPPED]} skipped" + (f" (run {report['run_id']})" if report.get("run_id") else "")]
    lines += [f"{b['status'].upper():<7} {build_id(b)}: {failure_cause(b)}" for b in builds if not passed(b["status"])]
    lines.append(f"full report: {build_dir / 'report.md'} (--markdown prints it), {build_dir / 'report.html'}")
    return "\n".join(lines) + "\n"


def cmd_report(args) -> int:
    from npubuild.config.load import project_dir
    from npubuild.report import history
    from npubuild.report.junit import write_junit
    from npubuild.report.regress import compare, load_thresholds, render_comparison
    from npubuild.report.reportfile import load_report, unreadable_metric
    from npubuild.report.status import passed
    from npubuild.report.summary import render_markdown, write_html

    if args.keep < 1:
        raise InputError(f"--keep must be at least 1, got {args.keep}")
    if args.junit and Path(args.junit).is_dir():
        raise InputError("is a directory: --junit takes the XML file's path (e.g. DIR/junit.xml)", args.junit)
    build_dir = build_dir_of(args)
    report = load_report(build_dir / "report.json")
    comparison, baseline = None, None
    text = render_markdown(report) if args.markdown else summary_text(report, build_dir)
    if args.baseline:
        baseline = load_report(Path(args.baseline))
        thresholds = load_thresholds(Path(args.thresholds) if args.thresholds else None, project_dir())
        for path, compared in ((build_dir / "report.json", report), (Path(args.baseline), baseline)):
            problem = unreadable_metric(compared, thresholds)
            if problem is not None:  # a damaged figure would make its comparison silently hold
                raise InputError(problem, str(path))
        comparison = compare(report, baseline, thresholds)
        text += "\n" + render_comparison(comparison, args.baseline)
    history_dir = args.history or os.environ.get("NPUBUILD_HISTORY")
    runs = history.record(Path(history_dir), report, args.keep) if history_dir else None
    if runs is not None:
        text += f"\nHistory: {len(runs)} run(s) in {history_dir}\n"
    print(text, end="")
    write_html(build_dir / "report.html", report, comparison, baseline=args.baseline,
               cache_dir=build_dir / ".cache" / "plots", history=runs)
    if args.junit:
        try:
            write_junit(Path(args.junit), report, comparison, baseline)
        except OSError as exc:  # said of the path given, not of the temp file written beside it
            if is_disk_full(exc):
                raise DiskFull(args.junit, "the JUnit XML") from None
            raise InputError(f"cannot write the JUnit XML: {exc.strerror or exc}", args.junit) from None
    failed = [b for b in report["builds"] if not passed(b["status"])]
    for r in comparison.regressions if comparison else []:
        print(f"regression: {r.line()}", file=sys.stderr)
    return 1 if failed or (comparison and comparison.regressions) else 0


def register(sub) -> None:
    r = sub.add_parser("report", help="print the report of a build directory, compare with a baseline",
                       description="Summarise a build directory's report and rewrite its report.html; with "
                                   "--baseline, per-metric deltas and regressions (exit 1 on any).")
    add_build_dir(r)
    r.add_argument("--baseline", metavar="REPORT_JSON",
                   help="an earlier run's report.json: show deltas, exit 1 on regressions (missing builds too)")
    r.add_argument("--thresholds", metavar="YAML",
                   help="regression thresholds (default: regressions.yaml at the project root, else built in)")
    r.add_argument("--junit", metavar="FILE", help="write JUnit XML here (one testcase per build and per gate)")
    r.add_argument("--history", metavar="DIR", help="add this run to a store of past reports in DIR and draw a "
                   "trend chart per metric (default: $NPUBUILD_HISTORY, else none)")
    r.add_argument("--keep", type=int, default=30, metavar="N", help="with --history: runs kept")
    r.add_argument("--markdown", action="store_true",
                   help="print the whole report.md (default: a summary: counts and the builds that did not pass)")
    r.set_defaults(func=cmd_report)
