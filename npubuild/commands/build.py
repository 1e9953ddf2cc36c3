"""`npubuild build`: build compile specs through the cached task graph."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from npubuild.errors import InputError


def cmd_build(args) -> int:
    from npubuild.build.session import build
    from npubuild.config.load import load_specs, spec_paths

    if args.jobs < 1:
        raise InputError(f"-n/--jobs must be at least 1, got {args.jobs}")
    builds = load_specs(spec_paths(args.specs))
    if args.only:
        builds = select(builds, args.only)
    live = {"auto": None, "live": True, "plain": False}[args.progress]
    result = build(builds, Path(args.build_dir), args.jobs, args.keep_going, args.quiet, args.debug, args.wait, live,
                   cache=args.cache, executor=args.executor, scheduler=args.scheduler)
    return result.exit_code


def matches(build_id: str, pattern: str) -> bool:
    """`--only` matching: a pattern with '/' matches the id's leading parts (`kws/*`, `kws/ds_cnn`,
    `*/*/ethos-u55-*`); one without matches any single part (spec, model or target)."""
    parts = build_id.split("/")
    n = pattern.count("/") + 1
    if n > 1:
        return fnmatch.fnmatchcase("/".join(parts[:n]), pattern)
    return any(fnmatch.fnmatchcase(p, pattern) for p in parts)


def select(builds: list, patterns: list[str]) -> list:
    """Builds matching any pattern; a pattern matching nothing is an error (a typo, not an empty nightly)."""
    for pat in patterns:
        if not any(matches(b.id, pat) for b in builds):
            raise InputError(f"--only '{pat}' matches no build (ids are spec/model/target, "
                             f"e.g. {builds[0].id if builds else 'none loaded'})")
    return [b for b in builds if any(matches(b.id, p) for p in patterns)]


def register(sub) -> None:
    b = sub.add_parser("build", help="build compile specs (default: configs/)")
    b.add_argument("specs", nargs="*", help="spec files or directories")
    b.add_argument("--build-dir", default="build")
    b.add_argument("-n", "--jobs", type=int, default=1)
    b.add_argument("--only", action="append", metavar="GLOB",
                   help="build only these (repeatable): a glob over spec/model/target ids, or over any one part")
    b.add_argument("--keep-going", action="store_true", help="go on with other builds after a failure")
    b.add_argument("--wait", action="store_true", help="wait for a build dir another build holds (default: stop)")
    b.add_argument("-q", "--quiet", action="store_true")
    b.add_argument("--progress", choices=["auto", "live", "plain"], default="auto",
                   help="live per-stage table, or one line per task (default: live on a terminal)")
    b.add_argument("--executor", choices=["doit", "dask"], default="doit",
                   help="doit (default, local processes) or dask (a Dask cluster; LocalCluster without --scheduler)")
    b.add_argument("--scheduler", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786")
    b.add_argument("--cache", help="shared stage cache: a directory or fsspec URL, or 'off' "
                                   "(default: $NPUBUILD_CACHE, else <build-dir>/cache)")
    b.set_defaults(func=cmd_build)
