"""`npubuild targets | pipelines | schema`: what is available, and the JSON Schemas for editors."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_targets(args) -> int:
    from npubuild.config.load import default_search_path, load_target, project_dir
    from npubuild.errors import Location
    from npubuild.ethosu.vela_ini import memory_mode_name

    search = default_search_path(project_dir())
    for name in search.names("targets"):
        t, path = load_target(name, search, Location(name))
        pools = ", ".join(f"{n}={p.kind}/{p.size_kib:g}KiB@{p.port}" for n, p in t.pools.items())
        pl = t.placement
        print(f"{t.name:<18} {t.accelerator:<16} {t.clock_mhz:>6g} MHz  pools: {pools}")
        print(f"{'':<18} placement: constants={pl.constants} arena={pl.arena} cache={pl.cache} "
              f"({memory_mode_name(t)})  platform: {t.platform}")
    return 0

def cmd_pipelines(args) -> int:
    from npubuild.config.load import default_search_path, load_pipeline, project_dir
    from npubuild.errors import Location

    search = default_search_path(project_dir())
    for name in search.names("pipelines"):
        p, _ = load_pipeline(name, search, Location(name))
        print(f"{p.name:<16} profile={p.profile:<4} passes: {', '.join(p.passes) or '-'}  {p.description}")
    return 0

def cmd_schema(args) -> int:
    from npubuild.config.schema import json_schema
    from npubuild.fileio import write_text

    text = json.dumps(json_schema(args.kind), indent=2) + "\n"
    if args.output:
        write_text(Path(args.output), text)
    else:
        print(text, end="")
    return 0


def register(sub) -> None:
    sub.add_parser("targets", help="list target profiles (the project's, then those shipped)",
                   description="List the target profiles found from here: the project's targets/, then the "
                               "ones shipped with npubuild.").set_defaults(func=cmd_targets)
    sub.add_parser("pipelines", help="list pipelines (the project's, then those shipped)",
                   description="List the pipelines found from here: the project's pipelines/, then the ones "
                               "shipped with npubuild.").set_defaults(func=cmd_pipelines)
    s = sub.add_parser("schema", help="print the JSON Schema of compile specs, target or pipeline files",
                       description="JSON Schema for editors (yaml-language-server). `npubuild build` also writes "
                                   "all three into the build dir: schema.json, target.schema.json, "
                                   "pipeline.schema.json.")
    s.add_argument("kind", nargs="?", choices=["spec", "target", "pipeline"], default="spec",
                   help="which file's schema (default: spec)")
    s.add_argument("-o", "--output", metavar="FILE", help="write it to FILE instead of stdout")
    s.set_defaults(func=cmd_schema)
