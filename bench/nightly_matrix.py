"""Benchmark npubuild on a nightly-sized matrix: `python bench/nightly_matrix.py [--models 20] [-n JOBS]`.

Generates, with npubuild's own model builder, N small DS-CNN style networks
(varied seeds, widths and depths) and one spec building each for 6 targets
(one of them a product-local profile), then measures with the real CLI:

- cold build, no-op rebuild, rebuild after one target profile changed (and
  how many tasks ran, and that they all belong to that target);
- peak memory (largest process), time per stage (from report.json);
- the no-op path split into spec loading, plan construction, doit with the
  up-to-date checks, report writing; and the up-to-date check cost per task.

Prints one Markdown table. Everything lives in a temporary directory (or
--work DIR, kept) so it never touches the repository's build/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from npubuild.fileio import write_bytes
from npubuild.models.builder import GraphBuilder

TARGETS = ["nightly-u55", "ethos-u55-64", "ethos-u55-256", "ethos-u65-256", "ethos-u85-256", "ethos-u85-512"]
CHANGED = "nightly-u55"
REPEATS = 3


def small_cnn(seed: int, width: int, blocks: int):
    """A DS-CNN-like keyword spotter: conv, `blocks` depthwise-separable blocks, pool, classifier."""
    g = GraphBuilder(f"kws_w{width}_b{blocks}_s{seed}", seed)
    x = g.input("input", [1, 1, 49, 10])
    x = g.relu(g.batchnorm(g.conv(x, 1, width, (10, 4), stride=(2, 2), pads=[4, 1, 5, 2]), width))
    for _ in range(blocks):
        x = g.relu(g.batchnorm(g.conv(x, width, width, (3, 3), group=width), width))
        x = g.relu(g.batchnorm(g.conv(x, width, width, (1, 1)), width))
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    x = g.gemm(x, width, 12)
    g.output(x, [1, 12])
    return g.model()


def make_project(root: Path, n_models: int) -> None:
    rng = np.random.default_rng(1234)
    (root / "configs" / "models").mkdir(parents=True, exist_ok=True)
    (root / "targets").mkdir(exist_ok=True)
    (root / "dodo.py").write_text("# benchmark product repo marker\n")
    models = []
    for i in range(n_models):
        width = int(rng.choice([8, 16, 24, 32]))
        blocks = int(rng.integers(1, 4))
        write_bytes(root / "configs" / "models" / f"m{i:02d}.onnx", small_cnn(i, width, blocks).SerializeToString())
        models.append(f"  m{i:02d}:\n    path: models/m{i:02d}.onnx\n"
                      f"    calibration: {{random: {{samples: 8, seed: {i}}}}}\n")
    (root / "targets" / f"{CHANGED}.yaml").write_text("extends: ethos-u55-128\n")
    (root / "configs" / "nightly.yaml").write_text(
        "version: 1\nname: nightly\nmodels:\n" + "".join(models)
        + f"targets: [{', '.join(TARGETS)}]\n"
        + "verify: {tosa: true, samples: 2}\nexpect: {npu_offload: 1.0, max_tosa_error_lsb: 1}\n")


def run_cli(root: Path, args: list[str]) -> tuple[float, int, int]:
    """Run `npubuild ARGS` in a child; returns (seconds, exit code, peak RSS KiB of the largest process)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "npubuild", *args], cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 1):
        raise SystemExit(f"npubuild {' '.join(args)} failed ({proc.returncode}): {err.strip()[-500:]}")
    return seconds, proc.returncode, usage.ru_maxrss


def run_json(build_dir: Path) -> dict:
    return json.loads((build_dir / "run.json").read_text())


def noop_breakdown(root: Path, build_dir: Path) -> dict[str, float]:
    """The no-op path in this process, timed by part (interpreter start-up and imports excluded)."""
    import npubuild.frontend.passes
    from npubuild.config.load import load_specs
    from npubuild.engine.cache import resolve_cache
    from npubuild.engine.doit_executor import DoitExecutor
    from npubuild.engine.plan import make_plan
    from npubuild.engine.run import RunOptions, run_plan
    from npubuild.engine.uptodate import is_done
    from npubuild.report.run import RunReports
    from npubuild.report.summary import make_report, write_reports
    from npubuild.stages import STAGES

    npubuild.frontend.passes.load_all()  # imports are paid once per process: timed apart (the start-up row)
    import npubuild.engine.uptodate

    npubuild.engine.uptodate._JSON_CACHE.clear()  # each repeat reads the records afresh, like a new process
    os.chdir(root)
    t0 = time.perf_counter()
    builds = load_specs([root / "configs"])
    t1 = time.perf_counter()
    plan = make_plan(builds, build_dir, STAGES)
    t2 = time.perf_counter()
    checks = [is_done(t) for t in plan.tasks.values()]
    t3 = time.perf_counter()
    result = run_plan(plan, DoitExecutor(resolve_cache(None, build_dir)), RunOptions(quiet=True), RunReports())
    t4 = time.perf_counter()
    write_reports(make_report(plan, result.run_id), build_dir, build_dir / ".cache" / "plots")
    t5 = time.perf_counter()
    if not all(checks) or result.executed:  # the code changed under us since the CLI run (a shared tree)
        print(f"warning: {len(result.executed)} tasks were not up to date in process", file=sys.stderr)
    return {"load specs": t1 - t0, "make plan": t2 - t1, "up-to-date checks": t3 - t2,
            "doit run (checks + report)": t4 - t3, "of which report writing": t5 - t4, "tasks": len(plan.tasks)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("-n", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--work", help="keep the generated project here instead of a temp dir")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="npubuild-bench-") as tmp:
        root = Path(args.work).resolve() if args.work else Path(tmp)
        make_project(root, args.models)
        build_dir = root / "build"
        common = ["build", "--build-dir", str(build_dir), "-q", "-n", str(args.jobs)]
        n_builds = args.models * len(TARGETS)
        rows: list[tuple[str, str]] = [("matrix", f"{args.models} models x {len(TARGETS)} targets = {n_builds} "
                                                  f"builds, -n {args.jobs}")]

        cold_s, code, cold_rss = run_cli(root, common)
        run = run_json(build_dir)
        report = json.loads((build_dir / "report.json").read_text())
        passed = sum(b["status"] == "passed" for b in report["builds"])
        rows.append(("cold build", f"{cold_s:.1f} s, {len(run['executed'])} tasks ran, {passed}/{n_builds} "
                                   f"builds passed (exit {code}), peak RSS {cold_rss / 1024:.0f} MiB"))

        noops = [run_cli(root, common) for _ in range(REPEATS)]  # best of: the machine may be shared
        noop_s, noop_rss = min(n[0] for n in noops), max(n[2] for n in noops)
        run = run_json(build_dir)
        rows.append((f"no-op rebuild (CLI, incl. start-up; best of {REPEATS})",
                     f"{noop_s:.2f} s = {noop_s / n_builds * 100:.2f} s per 100 builds (median "
                     f"{sorted(n[0] for n in noops)[REPEATS // 2]:.2f} s); "
                     f"{len(run['executed'])} ran, {len(run['cached'])} cached; peak RSS {noop_rss / 1024:.0f} MiB"))
        startups = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            # what the no-op CLI imports before it does any work (the same modules, nothing run)
            subprocess.run([sys.executable, "-c", "import npubuild.cli, npubuild.commands.build, npubuild.report.run, "
                            "npubuild.config.load, npubuild.frontend.passes; npubuild.cli.make_parser()"], check=True)
            startups.append(time.perf_counter() - start)
        startup = min(startups)
        rows.append(("  of which interpreter start-up + imports", f"{startup:.2f} s"))
        parts = min((noop_breakdown(root, build_dir) for _ in range(REPEATS)),
                    key=lambda p: p["load specs"] + p["make plan"] + p["doit run (checks + report)"])
        tasks = int(parts.pop("tasks"))
        inproc = parts["load specs"] + parts["make plan"] + parts["doit run (checks + report)"]
        rows.append((f"no-op rebuild (in process: specs + plan + doit + report; best of {REPEATS})",
                     f"{inproc:.3f} s = {inproc / n_builds * 100:.3f} s per 100 builds"))
        for k, v in parts.items():
            rows.append((f"  {k}", f"{v * 1000:.0f} ms"))
        rows.append(("up-to-date check per task", f"{parts['up-to-date checks'] / tasks * 1e6:.0f} us "
                                                  f"({tasks} tasks)"))

        profile = root / "targets" / f"{CHANGED}.yaml"
        profile.write_text("extends: ethos-u55-128\nclock_mhz: 400\n")
        one_s, _, one_rss = run_cli(root, common)
        run = run_json(build_dir)
        foreign = [n for n in run["executed"] if CHANGED not in n]
        rows.append((f"rebuild after one target ({CHANGED}) changed",
                     f"{one_s:.2f} s, {len(run['executed'])} tasks ran ({len(run['cached'])} cached), "
                     f"{'all of them' if not foreign else 'NOT only'} {CHANGED}'s"
                     + (f" (others: {', '.join(foreign[:3])})" if foreign else "")))

        per_stage: dict[str, list[float]] = {}
        for b in report["builds"]:
            for stage, s in b["stages"].items():
                if s.get("seconds") is not None and not s.get("cached"):
                    per_stage.setdefault(stage, []).append(s["seconds"])
        seen_tasks = {}
        for d in build_dir.glob("stages/*/*/stage.json"):
            rec = json.loads(d.read_text())
            seen_tasks.setdefault(rec["stage"], []).append(rec["seconds"])
        for stage, secs in seen_tasks.items():
            rows.append((f"stage {stage} (all runs)", f"{len(secs)} tasks, mean {np.mean(secs):.3f} s, "
                                           f"max {np.max(secs):.3f} s, total {np.sum(secs):.1f} s"))
        if "report" in per_stage:
            secs = per_stage["report"]
            rows.append(("stage report", f"{len(secs)} tasks, mean {np.mean(secs):.3f} s"))
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
