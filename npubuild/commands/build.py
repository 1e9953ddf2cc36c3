"""`npubuild build`: build compile specs through the cached task graph; and plain `doit` in a project
(its dodo.py is `npubuild.dodo_namespace`), the same build through doit's own command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from npubuild.commands import SPECS_HELP, add_build_dir, build_dir_of
from npubuild.errors import InputError, NpubuildError


def cmd_build(args) -> int:
    from npubuild.config.load import spec_paths
    from npubuild.config.selection import Selection
    from npubuild.engine.run import RunOptions
    from npubuild.report.run import RunReports, build_and_report
    from npubuild.stages import STAGES

    if args.jobs < 1:
        raise InputError(f"-n/--jobs must be at least 1, got {args.jobs}")
    selection, builds = Selection.load(spec_paths(args.specs), default=not args.specs, only=args.only or ())
    live = {"auto": None, "live": True, "plain": False}[args.progress]
    options = RunOptions(args.jobs, args.keep_going, args.debug, args.wait, args.cache, args.executor,
                         args.scheduler, args.quiet, live, args.verbose)
    return build_and_report(builds, build_dir_of(args), STAGES, options, RunReports(selection=selection)).exit_code


def dodo_namespace(dodo_file: str) -> dict:
    """The whole body of a project's dodo.py (npubuild.dodo_namespace): plain `doit` runs the same plan,
    session and reports as `npubuild build`.

    Builds every spec in configs/ next to dodo.py into build/ there. NPUBUILD_SPECS (paths separated by
    ':'), NPUBUILD_BUILD_DIR, NPUBUILD_CACHE and NPUBUILD_WAIT=1 (wait for a busy build dir) change that.
    """
    from npubuild.config.selection import Selection
    from npubuild.engine.cache import resolve_cache
    from npubuild.engine.capacity import stage_workers_setting
    from npubuild.engine.doit_executor import check_doit_jobs, doit_jobs, namespace
    from npubuild.engine.lock import acquire
    from npubuild.engine.plan import make_plan
    from npubuild.engine.session import Session
    from npubuild.machine import WORKERS_ENV
    from npubuild.report.run import RunReports
    from npubuild.stages import STAGES

    here = Path(dodo_file).resolve().parent
    specs = [Path(p) for p in os.environ.get("NPUBUILD_SPECS", str(here / "configs")).split(":")]
    try:
        selection, builds = Selection.load(specs, default="NPUBUILD_SPECS" not in os.environ)
        plan = make_plan(builds, Path(os.environ.get("NPUBUILD_BUILD_DIR", here / "build")), STAGES)
        jobs = doit_jobs(sys.argv[1:])
        check_doit_jobs(jobs, plan)  # doit forks its -n job slots itself: past what fits, refused
        workers = stage_workers_setting(jobs)
        cache_url = resolve_cache(None, plan.build_dir)
        lock_fd = acquire(plan.build_dir, wait=os.environ.get("NPUBUILD_WAIT") == "1")
    except NpubuildError as exc:
        print(exc, file=sys.stderr)
        sys.exit(exc.exit_code)
    if workers is not None:  # this doit process and its workers only: it ends with the run
        os.environ[WORKERS_ENV] = str(workers)
    session = Session(plan, RunReports(selection=selection), jobs=jobs)
    ns = namespace(plan, session, False, cache_url)
    ns["_npubuild_lock"] = lock_fd  # held until doit exits: no other build may write this build dir meanwhile
    return ns


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
