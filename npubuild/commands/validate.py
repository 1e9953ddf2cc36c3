"""`npubuild validate`: load and check specs without building."""

from __future__ import annotations


def cmd_validate(args) -> int:
    from npubuild.config.load import load_specs, spec_paths

    builds = load_specs(spec_paths(args.specs))
    specs = sorted({str(b.spec_path) for b in builds})
    print(f"ok: {len(specs)} spec(s), {len(builds)} build(s)")
    for b in builds:
        print(f"  {b.id}  ({b.target.accelerator}, pipeline {b.pipeline.name})")
    return 0


def register(sub) -> None:
    v = sub.add_parser("validate", help="check specs without building")
    v.add_argument("specs", nargs="*")
    v.set_defaults(func=cmd_validate)
