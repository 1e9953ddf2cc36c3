"""`npubuild compile`: one ONNX model for one or more targets, without YAML."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_compile(args) -> int:
    from npubuild.build.session import build
    from npubuild.config.load import adhoc_builds

    builds = adhoc_builds(Path(args.model), args.target, args.pipeline)
    result = build(builds, Path(args.build_dir), quiet=args.json, debug=args.debug)
    if args.json:
        entries = result.report["builds"]
        print(json.dumps(entries[0] if len(entries) == 1 else {"builds": entries}, indent=2))
    return result.exit_code


def register(sub) -> None:
    c = sub.add_parser("compile", help="build one ONNX model for a target, without YAML")
    c.add_argument("model")
    c.add_argument("--target", action="append", required=True, help="target profile name (repeatable)")
    c.add_argument("--pipeline", default="default")
    c.add_argument("--build-dir", default="build")
    c.add_argument("--json", action="store_true", help="print the build's report entry as JSON")
    c.set_defaults(func=cmd_compile)
