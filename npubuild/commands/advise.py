"""`npubuild advise MODEL_OR_SPEC [--latency-ms X] [--fps N]`: which Ethos-U configuration the model needs.

Builds the model for every shipped profile at a sweep of SRAM sizes (npubuild/advise.py) in parallel and
through the shared cache, then prints a table, writes a chart and a page, and names the smallest
configuration within the budget. Writes <build-dir>/advise/<model>/report.json (every build's entry and the
`advice` section), advice.html and advice.png; never the project's own reports.

Exit codes: 0 answered (within the budget, if one was given); 1 a budget no configuration meets, or no
configuration could hold the model; 2 bad input.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from npubuild.commands import add_build_dir, build_dir_of
from npubuild.errors import InputError

REPORT_SUBDIR = "advise"


def _jobs(value: int | None) -> int:
    """-n: default the cores this process may use; at most 4 per core (each job is a process with a model)."""
    from npubuild.fanout import available_cores

    cores = available_cores()
    if value is None:
        return cores
    if not 1 <= value <= 4 * cores:
        raise InputError(f"-n/--jobs must be from 1 to {4 * cores} (4 per core here), got {value}")
    return value


def cmd_advise(args) -> int:
    from npubuild.advise import (
        PROFILES,
        advisor_builds,
        analyse,
        budget_ms,
        configurations,
        load_profiles,
        parse_sizes,
        template_builds,
    )
    from npubuild.advise.page import chart_png, html_page, text_table, verdict
    from npubuild.engine.run import RunOptions
    from npubuild.fileio import write_bytes, write_text

    source = Path(args.source)
    if not source.is_file():
        raise InputError("no such file", str(source))
    budget = budget_ms(args.latency_ms, args.fps)
    jobs = _jobs(args.jobs)
    sizes = parse_sizes(args.sram)
    template = template_builds(source, args.model)
    names = [n.strip() for n in args.targets.split(",") if n.strip()] if args.targets else list(PROFILES)
    configs = configurations(load_profiles(names, template[0].project_root), sizes)
    builds = advisor_builds(template, configs)
    b0 = template[0]
    label = b0.model_name if b0.spec.name == "adhoc" else f"{b0.spec.name}-{b0.model_name}"
    build_dir = build_dir_of(args)
    out_dir = build_dir / REPORT_SUBDIR / re.sub(r"[^A-Za-z0-9_.-]", "_", label)
    import sys

    from npubuild.advise import advise_stages, is_misfit, known_misfits, vela_key
    from npubuild.engine.plan import make_plan
    from npubuild.report.run import RunReports, build_and_report
    from npubuild.report.summary import previous_report

    # the live table on a terminal; in a pipe or a log no line per task (a sweep has a hundred and more)
    quiet = args.json or not sys.stdout.isatty()
    stages = advise_stages()
    known = known_misfits(previous_report(out_dir / "report.json"))

    def run(some: list) -> list:
        # reports=None: advise writes its own report.json, page and chart (a build's report.md/html of every
        # configuration would be most of a cached rerun's time)
        options = RunOptions(jobs, keep_going=True, debug=args.debug, cache=args.cache, quiet=quiet, per_build=False)
        result = build_and_report(some, build_dir, stages, options, RunReports(None, summary=False))
        results.append(result)
        return result.report["builds"]

    results: list = []
    # first every configuration not known to misfit (and so every task they share); then the Vela key of each
    # known misfit, now that its inputs are there: the same key is the same answer, a new one is compiled
    first = [b for b in builds if b.target.name not in known] or builds[:1]
    entries = {e["target"]: e for e in run(first)}
    rest = [b for b in builds if b.target.name not in entries]
    plan = make_plan(builds, build_dir, stages)
    reused = {b.target.name: known[b.target.name][1] for b in rest if vela_key(plan, b) == known[b.target.name][0]}
    again = [b for b in rest if b.target.name not in reused]
    if again:
        entries.update({e["target"]: e for e in run(again)})
    entries.update(reused)
    keys = {b.target.name: vela_key(plan, b) for b in builds if is_misfit(entries.get(b.target.name) or {})}
    advice = analyse(b0.model_name, configs, entries, budget, keys)
    report = {**results[-1].report, "builds": [entries[c.name] for c in configs if c.name in entries],
              "advice": advice.as_json()}
    write_text(out_dir / "report.json", json.dumps(report) + "\n")
    if not any(p.fits for p in advice.points):  # nothing compiled: bad input is one line, exit 2, no table
        bad = next((b for b in report["builds"] if "input" in b.get("error_kinds", [])), None)
        if bad is not None:
            where, sep, rest = bad["errors"][0].partition("error: ")
            raise InputError(rest, where.rstrip(": ") or None) if sep else InputError(bad["errors"][0])
    png = chart_png(advice, build_dir / ".cache" / "plots")
    write_bytes(out_dir / "advice.png", png)
    write_text(out_dir / "advice.html", html_page(advice, png))
    if args.json:
        print(json.dumps(report["advice"], indent=2))
    else:
        print(text_table(advice))
        ran = sum(len(r.executed) - len(r.from_cache) for r in results)
        print(f"{ran} ran, {sum(len(r.cached) for r in results)} cached, "
              f"{sum(len(r.failed) for r in results)} failed, {sum(len(r.from_cache) for r in results)} restored "
              f"from the shared cache" + (f", {len(reused)} known not to fit (the same Vela inputs as the last "
                                          f"advise)" if reused else "")
              + f" ({sum(r.seconds for r in results):.0f} s); report: {out_dir / 'report.json'}, chart: "
              f"{out_dir / 'advice.png'}, page: {out_dir / 'advice.html'}")

    if not any(p.fits for p in advice.points) or (budget is not None and advice.chosen is None):
        if args.json:
            print(verdict(advice), file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    a = sub.add_parser("advise", help="which Ethos-U configuration a model needs: every profile and SRAM size",
                       description=__doc__.split("\n\n", 1)[1].split("\n\nExit codes")[0])
    a.add_argument("source", metavar="MODEL_OR_SPEC", help="an ONNX model (compile's defaults) or a compile spec "
                   "(its quantisation, calibration, pipeline and checks)")
    a.add_argument("--latency-ms", type=float, metavar="X", help="the budget: one inference in at most X ms")
    a.add_argument("--fps", type=float, metavar="N", help="the budget: N inferences a second (1000/N ms; with "
                   "--latency-ms the tighter)")
    a.add_argument("--model", help="with a spec of several models: the one to advise on")
    a.add_argument("--targets", metavar="NAME,...", help="the profiles to try (default: every shipped one, "
                   "ethos-u55-32 to ethos-u85-2048; a project's own profile of the same name is used instead)")
    a.add_argument("--sram", metavar="KIB,...", help="the SRAM sizes to try on each profile, beside its own "
                   "(default: 32,64,...,2048, powers of two; at most 12 sizes from 4 to 65536 KiB)")
    a.add_argument("-n", "--jobs", type=int, help="tasks run in parallel processes (default: the cores)")
    add_build_dir(a)
    a.add_argument("--cache", metavar="DIR_OR_URL", help="shared stage cache, as for build (default: "
                   "$NPUBUILD_CACHE, else .npubuild/cache in the project)")
    a.add_argument("--json", action="store_true", help="print report.json's advice section (nothing else)")
    a.set_defaults(func=cmd_advise)
