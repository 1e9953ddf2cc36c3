"""`npubuild compile`: one ONNX model for one or more targets, without YAML.

It shares the build dir's stage dirs and cache with `npubuild build`, but writes its own reports
(`<build-dir>/compile/report.json`, .md, .html, run.json), never the project's.
"""

from __future__ import annotations

from pathlib import Path

from npubuild.commands import add_build_dir, build_dir_of
from npubuild.fileio import dumps_indented

REPORT_SUBDIR = "compile"


def cmd_compile(args) -> int:
    from npubuild.config.load import adhoc_builds
    from npubuild.engine.run import RunOptions
    from npubuild.report.run import RunReports, build_and_report, warnings_block
    from npubuild.stages import STAGES

    builds = adhoc_builds(Path(args.model), args.target, args.pipeline)
    build_dir = build_dir_of(args)
    result = build_and_report(builds, build_dir, STAGES, RunOptions(quiet=True, debug=args.debug),
                              RunReports(build_dir / REPORT_SUBDIR, summary=False))
    entries = result.report["builds"]
    if args.json:
        print(dumps_indented(entries[0] if len(entries) == 1 else {"builds": entries}))  # json.dumps(indent=2), faster
    else:  # the result line `npubuild build` prints for each build, above its closing summary
        from npubuild.report.brief import result_line
        from npubuild.report.regress import build_id

        for entry in entries:
            print(result_line(build_id(entry), entry))
        print(warnings_block(result.report) + result.summary_line())
    return result.exit_code


def register(sub) -> None:
    c = sub.add_parser("compile", help="build one ONNX model for a target, without YAML",
                       description="Build one ONNX model for named targets with default settings. Its report "
                                   "goes to <build-dir>/compile/, not the project's report.")
    c.add_argument("model", metavar="MODEL.onnx", help="the ONNX model")
    c.add_argument("--target", action="append", required=True, metavar="NAME",
                   help="target profile name (repeatable; `npubuild targets` lists them)")
    c.add_argument("--pipeline", default="default", metavar="NAME", help="pipeline name (`npubuild pipelines`)")
    add_build_dir(c)
    c.add_argument("--json", action="store_true", help="print the build's report entry as JSON (nothing else)")
    c.set_defaults(func=cmd_compile)
