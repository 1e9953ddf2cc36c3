"""`npubuild build`: build compile specs through the cached task graph."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from npubuild.errors import InputError


def cmd_build(args) -> int:
    from npubuild.config.load import load_specs, spec_paths
    from npubuild.runner import build

    builds = load_specs(spec_paths(args.specs))
    if args.only:
        builds = [b for b in builds if fnmatch.fnmatch(b.id, args.only)]
        if not builds:
            raise InputError(f"--only '{args.only}' matches no build")
    result = build(builds, Path(args.build_dir), args.jobs, args.keep_going, args.quiet, args.debug)
    return result.exit_code


def register(sub) -> None:
    b = sub.add_parser("build", help="build compile specs (default: configs/)")
    b.add_argument("specs", nargs="*", help="spec files or directories")
    b.add_argument("--build-dir", default="build")
    b.add_argument("-n", "--jobs", type=int, default=1)
    b.add_argument("--only", help="glob over build ids spec/model/target")
    b.add_argument("--keep-going", action="store_true", help="go on with other builds after a failure")
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=cmd_build)
