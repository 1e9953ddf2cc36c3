"""Cold `npubuild compile` of models for one target, beside Vela alone on the TOSA it produced, for one or more
npubuild trees side by side (before/after a change) in one run.

    PYTHONPATH=. /work/main/.venv/bin/python bench/compile_speed.py [--target ethos-u55-128] [--repeats 3]
        [--tree before=/path/to/old/tree --tree after=.] [--models ds_cnn transformer /path/to/model.onnx[@TARGET]]

A model is a name in configs/models or an .onnx path (never written to), optionally with `@TARGET` for a target
of its own: MobileViT-xxs (timm, 645 nodes, 256x256; not in the repository: bench/mobilevit_xxs.py makes it)
needs 6.4 MiB of arena, which fits ethos-u65-256 / ethos-u85-256 (arena in DRAM) but not U55-128's SRAM, so
`--models ds_cnn transformer /path/to/mobilevit_xxs_256.onnx@ethos-u85-256`.

A benchmark script, not part of npubuild. Per repeat, model and tree (interleaved, so a load change on the
shared machine hits every tree alike) it runs, in fresh child processes:
- `npubuild compile MODEL --target T --json` in an empty build dir with an empty shared cache of its own
  (cold; a cache left from the previous run would restore every stage): wall seconds,
  CPU seconds (user + system of the whole process tree: what the load inflates least), and each stage's
  seconds from its stage record; what is left over is start-up, planning, doit and reports;
- Vela alone (`python -m ethosu.vela`, npubuild's very command line and .ini) on the TOSA graph(s) that
  build's vela stage compiled: wall and CPU seconds;
- start-up (per tree): `python -c pass`, `npubuild --help`, and each stage's implementation module imported
  one after another in one process (the increment each adds).
Prints one Markdown table per section: the best (least) of the repeats, the figure least disturbed by the
other jobs on the machine; the load average is printed with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["ds_cnn", "transformer"]


def timed(cmd: list[str], tree: Path, cwd: Path | None = None, cache: Path | None = None
          ) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds (user + system of the child and everything it waited for) of `cmd`."""
    env = {**{k: v for k, v in os.environ.items() if k != "NPUBUILD_CACHE"}, "PYTHONPATH": str(tree)}
    if cache is not None:
        env["NPUBUILD_CACHE"] = str(cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


def check_tree(tree: Path, cwd: Path) -> str:
    """The npubuild a child run from `cwd` imports with this tree on PYTHONPATH: the tree's own, or an error (an
    editable install or a source tree in `cwd` would otherwise time some other tree's code unseen)."""
    _, _, proc = timed([sys.executable, "-c", "import npubuild; print(npubuild.__file__)"], tree, cwd=cwd)
    found = Path(proc.stdout.strip()).resolve()
    if not found.is_relative_to(tree):
        raise SystemExit(f"error: with PYTHONPATH={tree} a child imports npubuild from {found}")
    return str(found)


def vela_alone(entry: dict, work: Path) -> tuple[float, float]:
    """Vela on the TOSA graph(s) this build's vela stage compiled, with its command line: wall and CPU s."""
    from npubuild.config.accelerator import Accelerator
    from npubuild.config.schema import TargetProfile, VelaOptions
    from npubuild.ethosu.vela import npu_partitions, vela_command
    from npubuild.records.lower import LowerRecord

    vela_dir = Path(entry["artifacts"]["vela"]).parent
    if vela_dir.name == "raw":
        vela_dir = vela_dir.parent
    record = json.loads((vela_dir / "stage.json").read_text())
    profile = TargetProfile.model_validate(record["config"]["target"])
    opts = VelaOptions.model_validate(record["config"]["vela"])
    lower_dir = Path(entry["artifacts"]["tosa"]).parent
    fam = Accelerator.parse(profile.accelerator).lowering_family
    wall = cpu = 0.0
    for index, tosa, _ in npu_partitions(LowerRecord.read(lower_dir / "io.json"), lower_dir, fam):
        out = work / f"vela-{index}"
        shutil.rmtree(out, ignore_errors=True)
        w, c, proc = timed(vela_command(tosa, vela_dir / "system.ini", out, profile, opts), ROOT)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-500:])
        wall, cpu = wall + w, cpu + c
    return wall, cpu


def compile_once(model: Path, target: str, tree: Path, work: Path) -> dict:
    build_dir, cache = work / "build", work / "cache"  # cold: an empty build dir and an empty shared cache, every run
    for d in (build_dir, cache):
        shutil.rmtree(d, ignore_errors=True)
    wall, cpu, proc = timed([sys.executable, "-m", "npubuild", "compile", str(model), "--target", target, "--json",
                             "--build-dir", str(build_dir)], tree, cwd=work, cache=cache)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr[-800:])
    entry = json.loads(proc.stdout)
    stages = {k: v["seconds"] for k, v in entry["stages"].items() if v.get("seconds") is not None}
    vela_wall, vela_cpu = vela_alone(entry, work)
    return {"wall_s": wall, "cpu_s": cpu, "stages": stages, "vela_wall_s": vela_wall, "vela_cpu_s": vela_cpu,
            "status": entry["status"]}


IMPORTS = """
import time, importlib
t0 = time.perf_counter()
import npubuild.cli
out = {"npubuild.cli": time.perf_counter() - t0}
from npubuild.stages import STAGES
for s in STAGES:  # an older tree's Stage.module was the implementation module (no .implementation)
    impl = getattr(s, "implementation", None) or s.module
    t = time.perf_counter()
    importlib.import_module(impl)
    out[s.name + " (" + impl + ")"] = time.perf_counter() - t
import json; print(json.dumps(out))
"""


def startup(tree: Path, work: Path) -> dict[str, float]:
    """Run in `work`, not here: `-c` and `-m` put the working directory first on sys.path, so run from a
    source tree they imported that tree's npubuild whatever PYTHONPATH said (every tree timed this one's)."""
    bare, _, _ = timed([sys.executable, "-c", "pass"], tree, cwd=work)
    cli, _, _ = timed([sys.executable, "-m", "npubuild", "--help"], tree, cwd=work)
    _, _, proc = timed([sys.executable, "-c", IMPORTS], tree, cwd=work)
    return {"python -c pass (wall)": bare, "npubuild --help (wall)": cli, **json.loads(proc.stdout)}


def model_path(name: str) -> Path:
    path = Path(name.split("@", 1)[0])
    return path if path.suffix == ".onnx" else ROOT / "configs" / "models" / f"{path}.onnx"


def model_target(name: str, default: str) -> str:
    """The target after `@` in a --models entry, else --target."""
    return name.split("@", 1)[1] if "@" in name else default


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="ethos-u55-128")
    ap.add_argument("--models", nargs="+", default=MODELS, help="names in configs/models, or .onnx paths")
    ap.add_argument("--tree", action="append", metavar="NAME=PATH",
                    help="an npubuild source tree to time (repeatable; default: this one)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, help="also write the Markdown here")
    args = ap.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(ROOT)}
    trees = {k: Path(v).resolve() for k, v in trees.items()}
    models = {model_path(m).stem: (model_path(m), model_target(m, args.target)) for m in args.models}
    runs: dict[tuple[str, str], list[dict]] = {(m, t): [] for m in models for t in trees}
    ups: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    loads = []
    for tree in trees.values():  # bytecode, as an installed npubuild has it (PYTHONDONTWRITEBYTECODE may be set)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "npubuild")], check=True,
                       capture_output=True)
    with tempfile.TemporaryDirectory(prefix="npb-compile-speed-") as tmp:
        for t, tree in trees.items():
            print(t, "runs", check_tree(tree, Path(tmp)), flush=True)
        for _ in range(args.repeats):
            for t, tree in trees.items():
                ups[t].append(startup(tree, Path(tmp)))
            for m, (path, target) in models.items():
                for t, tree in trees.items():
                    runs[(m, t)].append(compile_once(path, target, tree, Path(tmp)))
                    loads.append(os.getloadavg()[0])
                    print(m, t, json.dumps({**runs[(m, t)][-1], "load": loads[-1]}), flush=True)  # progress
    targets = ", ".join(sorted({f"{m} {t}" for m, (_, t) in models.items()}))
    lines = [f"Cold `npubuild compile` ({targets}), best of {args.repeats} per tree, the trees interleaved "
             f"(load average {min(loads):.1f}-{max(loads):.1f} during the runs, {os.cpu_count()} cores).", "",
             "| model | tree | status | compile wall s | Vela alone wall s | ratio (wall) | compile CPU s | "
             "Vela alone CPU s | ratio (CPU) | stages s (sum) | rest s (start-up, plan, doit, reports) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    stage_names: list[str] = []
    for (m, t), rs in runs.items():
        wall, cpu = min(r["wall_s"] for r in rs), min(r["cpu_s"] for r in rs)
        vela_wall, vela_cpu = min(r["vela_wall_s"] for r in rs), min(r["vela_cpu_s"] for r in rs)
        best = min(rs, key=lambda r: r["wall_s"])
        stage_sum = sum(best["stages"].values())
        lines.append(f"| {m} | {t} | {best['status']} | {wall:.2f} | {vela_wall:.2f} | {wall / vela_wall:.1f}x | "
                     f"{cpu:.2f} | {vela_cpu:.2f} | {cpu / vela_cpu:.1f}x | {stage_sum:.2f} | {wall - stage_sum:.2f} |")
        stage_names += [s for s in best["stages"] if s not in stage_names]
    lines += ["", "Per stage (stage.json seconds of the fastest run; each includes importing its implementation "
              "where the process had not yet):", "",
              "| model | tree | " + " | ".join(stage_names) + " |", "|---|---|" + "---:|" * len(stage_names)]
    for (m, t), rs in runs.items():
        best = min(rs, key=lambda r: r["wall_s"])
        lines.append(f"| {m} | {t} | " + " | ".join(f"{best['stages'][s]:.2f}" if s in best["stages"] else "-"
                                                for s in stage_names) + " |")
    lines += ["", "Start-up and imports (fresh process; stage modules imported in run order, increments; best of "
              "the repeats):", "", "| what | " + " | ".join(trees) + " |", "|---|" + "---:|" * len(trees)]
    keys = list(dict.fromkeys(k for t in trees for k in ups[t][0]))  # the trees' stages may differ: every one
    lines += [f"| {k} | " + " | ".join(f"{min(u.get(k, float('nan')) for u in ups[t]):.3f}" for t in trees) + " |"
              for k in keys]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
