"""Benchmark: the nightly matrix on the local doit executor, on a 2-worker Dask LocalCluster, and on
share-nothing Dask workers (`dask worker` subprocesses in their own cwd; where `unshare -Urm` works, in a
mount namespace in which the project and build dirs are an empty tmpfs, so the cache directory is all
they share with the client), cold and with a warm shared stage cache. Prints a markdown table
(bench/executors.md keeps the last one).

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
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
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


HIDE_AND_RUN = 'mount -t tmpfs tmpfs "$1" && cd "$2" && shift 2 && exec "$@"'


@contextmanager
def blind_workers(hidden: Path, scratch: Path, n: int):
    """A Dask client on a scheduler here with `n` worker subprocesses, each in its own cwd under `scratch`
    and, where user namespaces work, with `hidden` (the project and build dirs) an empty tmpfs to them."""
    from dask.distributed import Client, LocalCluster

    hide = shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-Urm", "true"], capture_output=True).returncode == 0
    cluster = LocalCluster(n_workers=0, host="127.0.0.1", dashboard_address=None)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUBUILD_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    procs = []
    try:
        for i in range(n):
            cwd = scratch / f"worker-{i}"
            cwd.mkdir(parents=True)
            worker = [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address, "--nthreads",
                      "1", "--no-nanny", "--no-dashboard", "--local-directory", str(cwd)]
            cmd = ["unshare", "-Urm", "sh", "-c", HIDE_AND_RUN, "sh", str(hidden), str(cwd), *worker] if hide else worker
            procs.append(subprocess.Popen(cmd, cwd=cwd, env={**env, "TMPDIR": str(cwd)}, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        client = Client(cluster)
        client.wait_for_workers(n, timeout=120)
        yield client, hide
        client.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
        cluster.close()


def run(executor: str, specs: Path, build_dir: Path, cache: Path, workers: int, client=None) -> dict:
    from npubuild.config.load import load_specs
    from npubuild.engine.run import RunOptions
    from npubuild.report.run import build_and_report
    from npubuild.stages import STAGES

    os.environ["NPUBUILD_CACHE"] = str(cache)
    builds = load_specs([specs])
    start = time.perf_counter()
    if executor == "doit":
        result = build_and_report(builds, build_dir, STAGES, RunOptions(jobs=workers, quiet=True))
    else:
        result = build_and_report(builds, build_dir, STAGES, RunOptions(jobs=workers, quiet=True, executor="dask"),
                                  client=client)
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
        client_side = tmp / "client"  # the project, build dirs and the other rows' caches: hidden from blind workers
        specs = make_project(client_side / "project", args.models, args.targets)
        rows = []
        for executor in ("doit", "dask"):
            cache = client_side / f"cache-{executor}"
            rows.append((executor, "cold", run(executor, specs, client_side / f"{executor}-cold", cache, args.workers)))
            rows.append((executor, "warm cache", run(executor, specs, client_side / f"{executor}-warm", cache,
                                                     args.workers)))
        # share-nothing: the cache (outside the client's directory) is all the workers see; the wall time
        # leaves out the workers' start, which a standing cluster does not pay per build
        with blind_workers(client_side, tmp / "workers", args.workers) as (client, hidden):
            name = "dask share-nothing" + ("" if hidden else " (project not hidden: no user namespaces)")
            cache = tmp / "shared-cache"
            rows.append((name, "cold", run("dask", specs, client_side / "blind-cold", cache, args.workers, client)))
            rows.append((name, "warm cache", run("dask", specs, client_side / "blind-warm", cache, args.workers,
                                                 client)))
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
