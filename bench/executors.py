"""Benchmark: the nightly matrix on the local doit executor and on a 2-worker Dask LocalCluster,
cold and with a warm shared stage cache. Prints a markdown table.

    python bench/executors.py [--models 20] [--targets 6] [--workers 2]

The matrix is made by npubuild's own code: DS-CNN variants (different seeds)
x the first N shipped target profiles, in a scratch project under /tmp.
"Warm" builds use a fresh build dir with the cache the cold build filled: what
a second machine (or tomorrow's nightly) sees. Overhead per task is wall time
minus the sum of the stages' own seconds, over the number of tasks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from npubuild.config.schema import ACCELERATORS
from npubuild.fileio import write_bytes
from npubuild.models.zoo import ds_cnn

TARGETS = ["ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u85-256", "ethos-u85-512",
           *ACCELERATORS]


def make_project(root: Path, n_models: int, n_targets: int) -> Path:
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# bench project\n")
    targets = list(dict.fromkeys(TARGETS))[:n_targets]
    models = []
    for i in range(n_models):
        write_bytes(root / "configs" / "models" / f"kws_{i}.onnx", ds_cnn(seed=i).SerializeToString())
        models.append(f"  kws_{i}:\n    path: models/kws_{i}.onnx\n")
    (root / "configs" / "matrix.yaml").write_text(
        "version: 1\nname: matrix\nmodels:\n" + "".join(models) + f"targets: [{', '.join(targets)}]\n"
        "verify: {samples: 2}\n")
    return root / "configs"


def stage_seconds(build_dir: Path) -> float:
    total = 0.0
    for p in build_dir.glob("stages/*/*/stage.json"):
        total += json.loads(p.read_text())["seconds"]
    for p in build_dir.glob("builds/**/stage.json"):
        total += json.loads(p.read_text())["seconds"]
    return total


def run(executor: str, specs: Path, build_dir: Path, cache: Path, workers: int) -> dict:
    import os

    from npubuild.build.session import build
    from npubuild.config.load import load_specs

    os.environ["NPUBUILD_CACHE"] = str(cache)
    builds = load_specs([specs])
    start = time.perf_counter()
    if executor == "doit":
        result = build(builds, build_dir, jobs=workers, quiet=True)
    else:
        result = build(builds, build_dir, jobs=workers, quiet=True, executor="dask")
    wall = time.perf_counter() - start
    assert result.exit_code == 0, f"{executor} build failed"
    tasks = len(result.plan.tasks)
    own = stage_seconds(build_dir)
    return {"builds": len(builds), "tasks": tasks, "wall_s": wall, "stage_s": own,
            "overhead_ms_per_task": 1000 * max(0.0, wall * workers - own) / tasks,
            "from_cache": sum(1 for p in build_dir.glob("stages/*/*/stage.json")
                              if json.loads(p.read_text()).get("from_cache"))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=int, default=20)
    ap.add_argument("--targets", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="npubuild-bench-"))
    try:
        specs = make_project(tmp / "project", args.models, args.targets)
        rows = []
        for executor in ("doit", "dask"):
            cache = tmp / f"cache-{executor}"
            rows.append((executor, "cold", run(executor, specs, tmp / f"{executor}-cold", cache, args.workers)))
            rows.append((executor, "warm cache", run(executor, specs, tmp / f"{executor}-warm", cache, args.workers)))
        print(f"\n{args.models} models x {args.targets} targets, {args.workers} workers/processes\n")
        print("| executor | cache | builds | tasks | wall s | sum of stage s | stages from cache | overhead ms/task |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for executor, kind, r in rows:
            print(f"| {executor} | {kind} | {r['builds']} | {r['tasks']} | {r['wall_s']:.1f} | {r['stage_s']:.1f} | "
                  f"{r['from_cache']} | {r['overhead_ms_per_task']:.1f} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
