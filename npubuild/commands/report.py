"""`npubuild report`: print the report of a build directory."""

from __future__ import annotations

from pathlib import Path

from npubuild.errors import InputError


def cmd_report(args) -> int:
    from npubuild.fileio import read_json
    from npubuild.summary import render_markdown

    path = Path(args.build_dir) / "report.json"
    if not path.is_file():
        raise InputError("no report.json: build first", str(path))
    try:
        report = read_json(path)
    except ValueError as exc:
        raise InputError(f"not a valid report: {exc}", str(path)) from None
    print(render_markdown(report), end="")
    return 0 if all(b["status"] == "passed" for b in report.get("builds", [])) else 1


def register(sub) -> None:
    r = sub.add_parser("report", help="print the report of a build directory")
    r.add_argument("--build-dir", default="build")
    r.set_defaults(func=cmd_report)
