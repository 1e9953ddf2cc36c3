"""`npubuild targets | pipelines | schema`: what is available, and the spec schema for editors."""

from __future__ import annotations

import json
from pathlib import Path


def cmd_targets(args) -> int:
    from npubuild.config.load import default_search_path, find_project_root, load_target
    from npubuild.errors import Location
    from npubuild.ethosu.vela_ini import memory_mode_name

    search = default_search_path(find_project_root(Path.cwd()))
    for name in search.names("targets"):
        t, path = load_target(name, search, Location(name))
        pools = ", ".join(f"{n}={p.kind}/{p.size_kib:g}KiB@{p.port}" for n, p in t.pools.items())
        pl = t.placement
        print(f"{t.name:<18} {t.accelerator:<16} {t.clock_mhz:>6g} MHz  pools: {pools}")
        print(f"{'':<18} placement: constants={pl.constants} arena={pl.arena} cache={pl.cache} "
              f"({memory_mode_name(t)})  platform: {t.platform}")
    return 0

def cmd_pipelines(args) -> int:
    from npubuild.config.load import default_search_path, find_project_root, load_pipeline
    from npubuild.errors import Location

    search = default_search_path(find_project_root(Path.cwd()))
    for name in search.names("pipelines"):
        p, _ = load_pipeline(name, search, Location(name))
        print(f"{p.name:<16} profile={p.profile:<4} passes: {', '.join(p.passes) or '-'}  {p.description}")
    return 0

def cmd_schema(args) -> int:
    from npubuild.config.schema import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def register(sub) -> None:
    sub.add_parser("targets", help="list target profiles").set_defaults(func=cmd_targets)
    sub.add_parser("pipelines", help="list pipelines").set_defaults(func=cmd_pipelines)
    sub.add_parser("schema", help="print the compile spec JSON Schema").set_defaults(func=cmd_schema)
