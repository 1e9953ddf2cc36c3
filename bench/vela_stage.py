"""The vela stage's time on the examples, trees side by side (issue 32: one Vela compile per partition, not two).

Builds every `configs/` spec for ethos-u55-128, ethos-u65-256 and ethos-u85-256 once (the first tree's npubuild,
in WORK/project), then runs each tree's vela stage (`npubuild.ethosu.vela.compile_model`, what the stage task
runs) on the same lower-stage outputs, each in a fresh process with that tree first on sys.path, the trees
interleaved, best of --repeats. CPU seconds are the process tree's (user + system, Vela's forked children
included): the figure to read on a shared machine; wall seconds follow the load.

    PYTHONPATH=. python bench/vela_stage.py --work DIR --tree before=/path/to/main --tree after=. [--repeats 2]
        [--lowered BUILD_DIR]

--lowered takes the lower stages of an existing build instead (the real models' build, say), read only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from routes import make_project  # noqa: E402

TARGETS = ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"]

WORKER = textwrap.dedent("""
    import json, resource, sys, tempfile, time
    from pathlib import Path
    from npubuild.config.load import default_search_path, load_target
    from npubuild.ethosu.vela import compile_model
    io_path, target, root = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    profile, _ = load_target(target, default_search_path(root), None)
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        compile_model(io_path, profile, profile.vela, stage, stage / "system.ini", stage / "summary.json")
        wall = time.perf_counter() - t0
        r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime + c1.ru_utime - c0.ru_utime
               + c1.ru_stime - c0.ru_stime)
        files = sorted(str(p.relative_to(stage)) for p in stage.rglob("*_vela.*"))
    print(json.dumps({"wall": wall, "cpu": cpu, "files": files}))
""")


def build(project: Path, tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree), "NPUBUILD_CACHE": "off"}
    subprocess.run([sys.executable, "-m", "npubuild", "build", "--build-dir", str(project / "build"), "-q",
                    "--keep-going", "--cache", "off"], cwd=project, env=env, check=False)


def lower_stages(build_dir: Path) -> list[tuple[str, Path]]:
    """(model, io.json) of every lower stage of the build."""
    return sorted((d.name.rsplit("-", 1)[0], d / "io.json")
                  for d in (build_dir / "stages" / "lower").iterdir() if (d / "io.json").is_file())


def time_stage(tree: Path, io_path: Path, target: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", WORKER, str(io_path), target, str(tree)], env=env, cwd=tree,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--reuse", action="store_true", help="keep WORK/project's build (its lower stages) if present")
    ap.add_argument("--lowered", type=Path, help="an existing build whose lower stages to compile (not built here)")
    args = ap.parse_args()
    trees = [(n, Path(p).resolve()) for n, p in (t.split("=", 1) for t in args.tree)]
    project = args.work / "project"
    build_dir = args.lowered or project / "build"
    if not args.lowered and not (args.reuse and (build_dir / "stages" / "lower").is_dir()):
        project = make_project(args.work, TARGETS)  # routes.py's copy of configs/
        build(project, trees[0][1])
    rows: dict[tuple[str, str, str], dict] = {}
    for model, io_path in lower_stages(build_dir):
        for target in TARGETS:
            for _ in range(args.repeats):
                for name, tree in trees:
                    got = time_stage(tree, io_path, target)
                    best = rows.get((model, target, name))
                    if best is None or ("cpu" in got and got["cpu"] < best.get("cpu", float("inf"))):
                        rows[(model, target, name)] = got
    names = [n for n, _ in trees]
    print(f"| model | target | {' | '.join(f'{n} CPU s | {n} wall s' for n in names)} | Vela outputs ({names[-1]}) |")
    print("|---|---|" + "---:|---:|" * len(names) + "---|")
    totals = {n: [0.0, 0.0] for n in names}
    for model, _ in lower_stages(build_dir):
        for target in TARGETS:
            cells = []
            for n in names:
                r = rows[(model, target, n)]
                if "error" in r:
                    cells.append(f"error: {r['error'][:60]} | -")
                    continue
                totals[n][0] += r["cpu"]
                totals[n][1] += r["wall"]
                cells.append(f"{r['cpu']:.2f} | {r['wall']:.2f}")
            files = ", ".join(rows[(model, target, names[-1])].get("files", []))
            print(f"| {model} | {target} | {' | '.join(cells)} | {files} |")
    print("| **total** | | " + " | ".join(f"**{c:.1f}** | **{w:.1f}**" for c, w in totals.values()) + " | |")


if __name__ == "__main__":
    main()
