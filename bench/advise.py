"""`npubuild advise` on the DS-CNN and real trained models: its answer, and what it costs cold and cached.

    python bench/advise.py [--real /work/scratch/<you>/real] [--specs mp_selfie_segmentation ...] [-n 2]

For each model: `npubuild advise SOURCE --fps F` in a fresh build dir with the shared cache off (cold: every
configuration compiled), then the same command twice more (the cached reruns: the first takes the misfits
from the cold run and, its early-fit task now keyed by one target set fewer, re-checks that and rewrites the
report entries; the second runs nothing), each in a child process, wall and CPU seconds measured around it. Prints one Markdown table of
the timings and, per model, the table `advise` printed. `--real` is a copy of ../shared/models/real with its
calibration made (never build inside /work/real itself); the DS-CNN comes from configs/models.
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

ROOT = Path(__file__).resolve().parents[1]


def advise(source: Path, cwd: Path, build_dir: Path, fps: float, jobs: str) -> tuple[float, float, str, dict]:
    """Wall and CPU seconds (user + system of the whole process tree: what the machine's load inflates
    least), what it printed, and report.json's advice."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "npubuild", "advise", str(source), "--fps", f"{fps:g}", "-n", jobs,
                           "--build-dir", str(build_dir), "--cache", "off"], cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"advise {source}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    label = next(iter(sorted((build_dir / "advise").iterdir())))
    report = json.loads((label / "report.json").read_text())
    return seconds, cpu, proc.stdout, report["advice"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--real", type=Path, help="a copy of ../shared/models/real (with calib/)")
    ap.add_argument("--specs", nargs="*", default=["mp_selfie_segmentation"], help="real specs to advise on")
    ap.add_argument("-n", "--jobs", default="2")
    args = ap.parse_args()
    cases = [("ds_cnn", ROOT / "configs" / "models" / "ds_cnn.onnx", ROOT, 10000.0)]
    if args.real:
        cases += [(s, args.real / "specs" / f"{s}.yaml", args.real, 30.0) for s in args.specs]
    rows, tables = [], []
    for name, source, cwd, fps in cases:
        with tempfile.TemporaryDirectory(prefix="npubuild-advise-") as tmp:
            build_dir = Path(tmp) / "build"
            cold, cold_cpu, out, advice = advise(source, cwd, build_dir, fps, args.jobs)
            warm, warm_cpu, _, again = advise(source, cwd, build_dir, fps, args.jobs)
            third, third_cpu, _, _ = advise(source, cwd, build_dir, fps, args.jobs)
            def answer(a: dict) -> tuple:
                return a["chosen"], [(p["config"], p["fits"], p["inference_ms"]) for p in a["configurations"]]

            assert answer(again) == answer(advice), "the cached rerun must give the same answer"
            reused = sum(1 for p in again["configurations"] if p.get("reused_from"))
            n = len(advice["configurations"])
            fits = sum(p["fits"] for p in advice["configurations"])
            rows.append(f"| {name} | {n} ({fits} fit) | {fps:g} fps | {advice['chosen'] or 'none'} | "
                        f"{cold:.1f} ({cold_cpu:.1f} CPU) | {warm:.1f} ({warm_cpu:.1f} CPU) | "
                        f"{third:.1f} ({third_cpu:.1f} CPU) | {reused} |")
            tables.append(f"### {name}\n\n```\n{out.rstrip()}\n```\n")
    print(f"load average {os.getloadavg()[0]:.2f}, -n {args.jobs}, cache off (cold), then the same command\n")
    print("| model | configurations | budget | smallest within budget | cold s | rerun s | again s | misfits "
          "not recompiled |")  # wall (CPU) seconds
    print("|---|---:|---|---|---:|---:|---:|---:|")
    print("\n".join(rows))
    print()
    print("\n".join(tables))


if __name__ == "__main__":
    main()
