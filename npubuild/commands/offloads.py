"""`npubuild offloads SPEC_OR_MODEL --target NAME`: where every ONNX node runs, one line per node.

Builds (cached) what is needed and prints, for each node of the input model,
its placement (NPU partition n, or CPU in host partition n), the TOSA ops it
was lowered to, and for a CPU node the support rule that sent it there, like
TVMC's `--dump-offloads`. It shares the build dir's stage dirs and cache, and writes no report:
the project's report.json, report.md/html and run.json stay those of the last `npubuild build`.
"""

from __future__ import annotations

import json
from pathlib import Path

from npubuild.commands import add_build_dir, build_dir_of
from npubuild.errors import InputError


def offload_line(p: dict) -> str:
    ops = ", ".join(p["tosa_ops"]) or "-"
    precision = f"  {p['precision']}" if p.get("precision") else ""  # a build with 16-bit or 4-bit layers
    if p["kind"] == "npu":
        return f"{p['node']}  {p['op_type']}{precision}  -> NPU partition {p['partition']}  [{ops}]"
    return (f"{p['node']}  {p['op_type']}{precision}  -> CPU (host partition {p['partition']})  [{ops}]  "
            f"rule {p['rule']}: {p['reason']}")


def _builds(source: Path, target: str, pipeline: str):
    from npubuild.config.load import adhoc_builds, load_specs

    if source.suffix == ".onnx":
        return adhoc_builds(source, [target], pipeline)
    builds = [b for b in load_specs([source]) if b.target.name == target]
    if not builds:
        raise InputError(f"no build of this spec targets '{target}'", str(source))
    return builds


def cmd_offloads(args) -> int:
    from npubuild.engine.run import RunOptions
    from npubuild.fileio import read_json
    from npubuild.report.run import RunReports, build_and_report
    from npubuild.stages import STAGES

    builds = _builds(Path(args.source), args.target, args.pipeline)
    result = build_and_report(builds, build_dir_of(args), STAGES, RunOptions(quiet=True, debug=args.debug),
                              RunReports(None, summary=False))
    plan = result.plan
    entries = []
    for b in builds:
        chain = plan.build_tasks[b.id]
        vela = plan.tasks[chain["vela"]] if "vela" in chain else None
        summary = vela.outputs["summary"] if vela is not None else None
        if summary is None or not summary.is_file():  # the failed task's error line is on stderr already
            return result.exit_code or 1
        data = read_json(summary)
        entries.append({"build": b.id, "npu_partitions": data.get("npu_partitions"),
                        "host_ops": data.get("host_ops"), "offloads": data.get("offloads", [])})
    if args.json:
        print(json.dumps(entries[0] if len(entries) == 1 else entries, indent=2))
        return result.exit_code
    for e in entries:
        if len(entries) > 1:
            print(f"# {e['build']}")
        for p in e["offloads"]:
            print(offload_line(p))
        print(f"# {e['npu_partitions']} NPU partition(s), {e['host_ops']} node(s) on the CPU")
    return result.exit_code


def register(sub) -> None:
    c = sub.add_parser("offloads", help="print where each ONNX node runs on a target (NPU partition or CPU)")
    c.add_argument("source", metavar="SPEC_OR_MODEL", help="a compile spec (.yaml) or an ONNX model")
    c.add_argument("--target", required=True, metavar="NAME", help="target profile name")
    c.add_argument("--pipeline", default="default", metavar="NAME",
                   help="pipeline for an ONNX model (specs name their own)")
    add_build_dir(c)
    c.add_argument("--json", action="store_true", help="print the placements as JSON")
    c.set_defaults(func=cmd_offloads)
