"""Cold `npubuild compile` of small models for one target, beside Vela alone on the TOSA it produced (one run).

    PYTHONPATH=. /work/main/.venv/bin/python bench/compile_speed.py [--target ethos-u55-128] [--repeats 3]

A benchmark script, not part of npubuild. Per model (DS-CNN and the 2-layer transformer of configs/models by
default) and repeat it runs, in fresh child processes:
- `npubuild compile MODEL --target T --json` in an empty build dir with an empty cache (cold): wall seconds,
  and each stage's seconds from its stage record; what is left over is start-up, planning, doit and reports;
- Vela alone (`python -m ethosu.vela`, npubuild's very command line and .ini) on the TOSA graph that build's
  vela stage compiled: wall seconds;
- start-up: `python -c pass`, `import npubuild.cli`, and each stage's implementation module imported one after
  another in one process (the increment each adds: the part of a stage's seconds that is imports).
Prints one Markdown table per section, medians over the repeats (the machine is shared: see the load average
printed with it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["ds_cnn", "transformer"]


def timed(cmd: list[str], cwd: Path | None = None) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False,
                          env={**{k: v for k, v in os.environ.items() if k != "NPUBUILD_CACHE"},  # cache in build dir
                               "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - start, proc


def vela_alone(entry: dict, work: Path) -> float:
    """Vela on the TOSA graph(s) this build's vela stage compiled, with its command line: wall seconds."""
    from npubuild.config.accelerator import Accelerator
    from npubuild.config.schema import TargetProfile, VelaOptions
    from npubuild.ethosu.vela import npu_partitions, vela_command
    from npubuild.stages.records import LowerRecord

    vela_dir = Path(entry["artifacts"]["vela"]).parent
    record = json.loads((vela_dir / "stage.json").read_text())
    profile = TargetProfile.model_validate(record["config"]["target"])
    opts = VelaOptions.model_validate(record["config"]["vela"])
    lower_dir = Path(entry["artifacts"]["tosa"]).parent
    fam = Accelerator.parse(profile.accelerator).lowering_family
    total = 0.0
    for index, tosa, _ in npu_partitions(LowerRecord.read(lower_dir / "io.json"), lower_dir, fam):
        out = work / f"vela-{index}"
        shutil.rmtree(out, ignore_errors=True)
        seconds, proc = timed(vela_command(tosa, vela_dir / "system.ini", out, profile, opts))
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-500:])
        total += seconds
    return total


def compile_once(model: Path, target: str, work: Path) -> dict:
    build_dir = work / "build"
    shutil.rmtree(build_dir, ignore_errors=True)
    seconds, proc = timed([sys.executable, "-m", "npubuild", "compile", str(model), "--target", target, "--json",
                           "--build-dir", str(build_dir)], cwd=work)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr[-800:])
    entry = json.loads(proc.stdout)
    stages = {k: v["seconds"] for k, v in entry["stages"].items() if v.get("seconds") is not None}
    return {"wall_s": seconds, "stages": stages, "vela_alone_s": vela_alone(entry, work)}


IMPORTS = """
import time, importlib
t0 = time.perf_counter()
import npubuild.cli
out = {"npubuild.cli": time.perf_counter() - t0}
from npubuild.stages import STAGES
for s in STAGES:
    t = time.perf_counter()
    importlib.import_module(s.module)
    out[s.name + " (" + s.module + ")"] = time.perf_counter() - t
import json; print(json.dumps(out))
"""


def startup() -> dict[str, float]:
    bare, _ = timed([sys.executable, "-c", "pass"])
    cli, _ = timed([sys.executable, "-m", "npubuild", "--help"])
    _, proc = timed([sys.executable, "-c", IMPORTS])
    return {"python -c pass (wall)": bare, "npubuild --help (wall)": cli, **json.loads(proc.stdout)}


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="ethos-u55-128")
    ap.add_argument("--models", nargs="+", default=MODELS, help="names in configs/models")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {m: [] for m in args.models}
    ups: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="npb-compile-speed-") as tmp:
        for _ in range(args.repeats):
            ups.append(startup())
            for m in args.models:
                runs[m].append(compile_once(ROOT / "configs" / "models" / f"{m}.onnx", args.target, Path(tmp)))
    load = os.getloadavg()
    lines = [f"Cold `npubuild compile --target {args.target}`, median of {args.repeats} (load average "
             f"{load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores).", "",
             "| model | npubuild compile s | Vela alone s | ratio | stages s (sum) | rest s (start-up, plan, doit, "
             "reports) |", "|---|---:|---:|---:|---:|---:|"]
    stage_names: list[str] = []
    for m, rs in runs.items():
        wall, vela = med([r["wall_s"] for r in rs]), med([r["vela_alone_s"] for r in rs])
        stage_sum = med([sum(r["stages"].values()) for r in rs])
        lines.append(f"| {m} | {wall:.2f} | {vela:.2f} | {wall / vela:.1f}x | {stage_sum:.2f} | {wall - stage_sum:.2f} |")
        stage_names += [s for s in rs[0]["stages"] if s not in stage_names]
    lines += ["", "Per stage (stage.json seconds; each includes importing its implementation the first time):", "",
              "| model | " + " | ".join(stage_names) + " |", "|---|" + "---:|" * len(stage_names)]
    for m, rs in runs.items():
        lines.append(f"| {m} | " + " | ".join(f"{med([r['stages'].get(s, 0.0) for r in rs]):.2f}"
                                               for s in stage_names) + " |")
    lines += ["", "Start-up and imports (fresh process; stage modules imported in run order, increments):", "",
              "| what | s |", "|---|---:|"]
    lines += [f"| {k} | {med([u[k] for u in ups]):.3f} |" for k in ups[0]]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
