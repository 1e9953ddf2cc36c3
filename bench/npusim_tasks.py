"""The npu-sim stage's CPU per task, tree against tree, on a finished build's own inputs.

    PYTHONPATH=. python bench/npusim_tasks.py SPEC BUILD_DIR --tree before=/path/a --tree after=/path/b [--rounds N]

For every npu-sim task of BUILD_DIR (a build of SPEC), runs the task's work (verify.npu_sim.simulate_build on
the vela/lower/import/quantize outputs and tosa-check's kept runs (runs.npz) the build wrote, with the task's
config from its stage.json) in a fresh
process with each tree's code in turn (interleaved, so load drifts hit both alike), and prints the process CPU
seconds and whether the record equals the build's npusim.json but for `sim_seconds` (a change that claims to
be behaviour-identical shows it here). Why a table and not a test: speed is not asserted in tests.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _one(job: Path, out: Path) -> None:
    """Child: one task's work with this process's npubuild (the tree on PYTHONPATH)."""
    from npubuild.stages.npu_sim import NpuSimConfig
    from npubuild.verify.npu_sim import SimFiles, SimSamples, simulate_build

    j = json.loads(job.read_text())
    config = NpuSimConfig.from_json(j["config"])
    files = SimFiles(*(Path(j[k]) if j.get(k) else None for k in
                       ("vela", "io", "float", "calibration", "eval_inputs", "reference", "runs")))
    t0, w0 = time.process_time(), time.perf_counter()
    simulate_build(files, SimSamples(config.samples_from, config.calibration), out)
    print(f"cpu {time.process_time() - t0:.2f} wall {time.perf_counter() - w0:.2f}")


def _first(build: Path, pattern: str) -> str | None:
    found = sorted(glob.glob(str(build / pattern)))
    return found[0] if found else None


def _jobs(spec: Path, build: Path) -> list[tuple[str, dict, Path]]:
    """(task name, the child's job, the build's npusim.json) for every npu-sim task of the build."""
    jobs = []
    for stage in sorted(build.glob("stages/npu-sim/*/stage.json")):
        record = json.loads(stage.read_text())
        name = stage.parent.name.rsplit("-", 1)[0]
        config = {k: v for k, v in record["config"].items() if k not in ("stage", "versions")}
        npy = config["calibration"].get("npy")
        job = {"config": config,
               "vela": _first(build, f"stages/vela/{name}-*/summary.json"),
               "io": _first(build, "stages/lower/*/io.json"),
               "float": _first(build, "stages/import/*/model.onnx"),
               "calibration": str((spec.parent / npy).resolve()) if npy else None,
               "eval_inputs": None,
               "reference": _first(build, "stages/precision/*/model_*.onnx") or _first(
                   build, "stages/quantize/*/model_qdq.onnx"),
               "runs": _first(build, "stages/tosa-check/*/runs.npz")}
        jobs.append((name, job, stage.parent / "npusim.json"))
    return jobs


def _same_record(a: Path, b: Path) -> bool:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    x.pop("sim_seconds", None)
    y.pop("sim_seconds", None)
    return x == y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("build", type=Path)
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH of a source tree (repeatable)")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    print("| task | round | " + " | ".join(f"{n} CPU s" for n, _ in trees) + " | records | load (1 min) |")
    print("|---|---:|" + "---:|" * len(trees) + "---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, job, record in _jobs(args.spec, args.build):
            job_file = Path(tmp) / "job.json"
            job_file.write_text(json.dumps(job))
            for r in range(args.rounds):
                cpu, same = [], []
                for tree_name, path in trees:
                    out = Path(tmp) / f"{tree_name}.json"
                    env = {**os.environ, "PYTHONPATH": path}
                    proc = subprocess.run([sys.executable, __file__, "--one", str(job_file), str(out)], cwd=path,
                                          env=env, capture_output=True, text=True)
                    if proc.returncode:
                        sys.exit(f"{tree_name} on {name}: {proc.stderr.strip().splitlines()[-1]}")
                    cpu.append(proc.stdout.split()[-3])
                    same.append(_same_record(record, out))
                load = os.getloadavg()[0]
                verdict = "identical but sim_seconds" if all(same) else "DIFFER: " + ", ".join(
                    n for (n, _), s in zip(trees, same, strict=True) if not s)
                print(f"| {name} | {r + 1} | " + " | ".join(cpu) + f" | {verdict} | {load:.1f} |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        _one(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        main()
