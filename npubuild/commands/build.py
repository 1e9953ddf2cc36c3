"""`npubuild build`: build compile specs through the cached task graph."""

from __future__ import annotations

import fnmatch

from npubuild.commands import SPECS_HELP, add_build_dir, build_dir_of
from npubuild.errors import InputError


def cmd_build(args) -> int:
    from npubuild.config.load import load_specs, spec_paths
    from npubuild.engine.session import build
    from npubuild.stages import STAGES

    if args.jobs < 1:
        raise InputError(f"-n/--jobs must be at least 1, got {args.jobs}")
    paths = spec_paths(args.specs)
    builds = load_specs(paths)
    selection = {"specs": [str(p) for p in paths], "default": not args.specs,
                 "spec_names": sorted({b.spec.name for b in builds}), "only": list(args.only or [])}
    if args.only:
        builds = select(builds, args.only)
    live = {"auto": None, "live": True, "plain": False}[args.progress]
    result = build(builds, build_dir_of(args), STAGES, args.jobs, args.keep_going, args.quiet, args.debug, args.wait, live,
                   cache=args.cache, executor=args.executor, scheduler=args.scheduler, selection=selection,
                   verbose=args.verbose)
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
    b = sub.add_parser("build", help="build compile specs (default: the project's configs/)",
                       description="Build every spec x model x target through the cached task graph; writes "
                                   "report.json/md/html and run.json in the build directory.")
    b.add_argument("specs", nargs="*", metavar="SPEC_OR_DIR", help=SPECS_HELP)
    add_build_dir(b)
    b.add_argument("-n", "--jobs", type=int, default=1, help="tasks run in parallel processes")
    b.add_argument("--only", action="append", metavar="GLOB",
                   help="build only these (repeatable): a glob over spec/model/target ids, or over any one part "
                        "(default: every build)")
    b.add_argument("--keep-going", action="store_true", help="go on with other builds after a failure")
    b.add_argument("--wait", action="store_true", help="wait for a build dir another build holds (default: stop)")
    b.add_argument("-q", "--quiet", action="store_true",
                   help="no per-task lines or live table; the closing summary and report path still")
    b.add_argument("-v", "--verbose", action="store_true",
                   help="also a line for each task found up to date and each build with nothing to do")
    b.add_argument("--progress", choices=["auto", "live", "plain"], default="auto",
                   help="live: bar, per-stage table and results on a terminal; plain: one line per event "
                        "(default: auto, live when stdout is a terminal)")
    b.add_argument("--executor", choices=["doit", "dask"], default="doit",
                   help="doit (local processes) or dask (a Dask cluster whose workers need only the shared cache, "
                        "not this machine's files; a local cluster without --scheduler)")
    b.add_argument("--scheduler", metavar="ADDRESS",
                   help="Dask scheduler address, e.g. tcp://10.0.0.5:8786 (default: a local 2-worker cluster)")
    b.add_argument("--cache", metavar="DIR_OR_URL",
                   help="shared stage cache: a directory or fsspec URL, or 'off' (default: $NPUBUILD_CACHE, "
                        "else .npubuild/cache in the project holding the build dir); --executor dask needs one its "
                        "workers reach (an s3:// or other URL for workers on other machines)")
    b.set_defaults(func=cmd_build)
