"""Cold `npubuild build` of every real trained model's spec, for one or more npubuild trees side by side, beside
Vela alone on the TOSA each target compiled: where a real model's compile time goes, and the TOSA check's share.

    PYTHONPATH=. .venv/bin/python bench/compile_real.py --real <copy of shared/models/real> \
        [--tree before=/path/to/old/tree --tree after=.] [--only NAME ...] [--clock-runs] [--out bench/compile_real.md]

A benchmark script, not part of npubuild. --real is a writable copy of shared/models/real with its calibration
made (its README says how). Per spec and tree (the trees interleaved, so a load change on the shared machine hits
both alike), in fresh child processes:
- `npubuild build SPEC --build-dir B --cache off` in an empty build dir (cold: every stage runs; the spec's
  three targets, ethos-u55-128 / ethos-u65-256 / ethos-u85-256): wall seconds, CPU seconds (user + system of the
  whole process tree: the figure the load inflates least), and every stage's seconds from its stage record;
- Vela alone (npubuild's own command line and .ini, bench/compile_speed.vela_alone) on the TOSA graph(s) each
  target's vela stage compiled: CPU seconds per target.
The stages shared by the targets (import, early-fit, quantize, precision, lower, tosa-check: whichever a tree
has) run once a spec; vela, npu-sim, evaluate, fvp and report once a target. The check's share is the
tosa-check stage's seconds over the sum of the stages'. "Beyond the check, per target / Vela alone" is the
build's CPU seconds less the check's share of them (the stages' wall shares apportion the CPU: no stage
records its own CPU), over the targets, against Vela alone's mean CPU seconds per target; the same without
npu-sim too (a stage the older trees do not have: it runs the deployable on the virtual device).
`--clock-runs` also puts bench/runclock on the builds' PYTHONPATH: its sitecustomize clocks the process CPU inside
every onnxruntime run, TOSA reference-model run and npu-sim simulation, and a second table gives the build's CPU
beyond all of them per target over Vela alone's (the compile work, not the checking).
`--replay LOG` renders the table again from the JSON lines a run printed (no build).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_speed import check_tree, timed, vela_alone  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("import", "early-fit", "quantize", "precision", "lower", "tosa-check")  # once a spec, whatever the target
SHOWN = ("import", "quantize", "lower", "tosa-check")
RUNCLOCK = Path(__file__).resolve().parent / "runclock"  # its sitecustomize clocks the model runs (--clock-runs)


def build_once(spec: Path, tree: Path, work: Path, clock_runs: bool = False) -> dict:
    build_dir = work / "build"
    shutil.rmtree(build_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "npubuild", "build", str(spec), "--build-dir", str(build_dir), "--cache", "off",
           "--keep-going", "-q"]
    clock = work / "runclock.log"
    clock.unlink(missing_ok=True)
    if clock_runs:
        wall, cpu, proc = timed_with_env(cmd, spec.parent.parent, {"PYTHONPATH": f"{tree}{os.pathsep}{RUNCLOCK}",
                                                                    "NPUBUILD_RUNCLOCK": str(clock)})
    else:
        wall, cpu, proc = timed(cmd, tree, cwd=spec.parent.parent)
    runs, compiles = model_runs(clock) if clock_runs else (None, None)
    report = build_dir / "report.json"
    if not report.exists():
        return {"wall_s": wall, "cpu_s": cpu, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    entries = json.loads(report.read_text())["builds"]
    stages: dict[str, float] = {}
    per_target: dict[str, dict] = {}
    for e in entries:
        for name, s in (e.get("stages") or {}).items():
            if s.get("seconds") is None or s.get("from_cache"):
                continue
            if name in SHARED:
                stages[name] = s["seconds"]  # the same stage record in every target's entry
            else:
                per_target.setdefault(e["target"], {})[name] = s["seconds"]
        t = per_target.setdefault(e["target"], {})
        t["status"] = e["status"]
        errors = [f"{name}: {s['error']}" for name, s in (e.get("stages") or {}).items() if s.get("error")]
        if errors:
            t["error"] = errors[0][:200]
        try:
            t["vela_alone_cpu_s"] = vela_alone(e, work)[1] if e.get("artifacts", {}).get("vela") else None
        except (RuntimeError, KeyError, FileNotFoundError):
            t["vela_alone_cpu_s"] = None
    out = {"wall_s": wall, "cpu_s": cpu, "stages": stages, "targets": per_target}
    if runs is not None:
        out["runs"], out["vela_compiles"] = runs, compiles
    return out


def timed_with_env(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """compile_speed.timed with the environment's PYTHONPATH (and more) given whole: the run clock's path too."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False,
                          env={**{k: v for k, v in os.environ.items() if k != "NPUBUILD_CACHE"}, **env})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc


def model_runs(log: Path) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """CPU seconds inside model runs (and Vela compiles) from bench/runclock's log: {kind: {stage: s}}, and the
    number of Vela compiles per stage."""
    runs: dict[str, dict[str, float]] = {}
    compiles: dict[str, int] = {}
    for line in (log.read_text().splitlines() if log.exists() else []):
        kind, stage, seconds = line.split()
        runs.setdefault(kind, {}).setdefault(stage, 0.0)
        runs[kind][stage] += float(seconds)
        if kind == "vela":
            compiles[stage] = compiles.get(stage, 0) + 1
    return runs, compiles


def beyond_runs(r: dict) -> float | None:
    """CPU seconds per target beyond every model run, over Vela alone's mean: the build's CPU less the
    onnxruntime and reference-model runs (any stage) and npu-sim's whole simulation (a run of the deployable on
    the virtual device, its own reference-model runs inside it), each clocked by bench/runclock; Vela's compiles
    are compile work and stay in."""
    tr = r["targets"].values()
    alone = [t["vela_alone_cpu_s"] for t in tr if t.get("vela_alone_cpu_s")]
    total = stage_sum(r)
    if not alone or not total or "runs" not in r:
        return None
    beyond = r["cpu_s"] - sum(s for k, kind in r["runs"].items() if k != "vela" for s in kind.values())
    return beyond / len(r["targets"]) / (sum(alone) / len(alone))


def beyond_check(r: dict, without: tuple[str, ...] = ()) -> float | None:
    """CPU seconds per target beyond the check (and the `without` per-target stages), over Vela alone's mean."""
    tr = r["targets"].values()
    alone = [t["vela_alone_cpu_s"] for t in tr if t.get("vela_alone_cpu_s")]
    total = stage_sum(r)
    if not alone or not total:
        return None
    out = r["stages"].get("tosa-check", 0.0) + sum(t.get(s, 0.0) for t in tr for s in without)
    return r["cpu_s"] * (1 - out / total) / len(r["targets"]) / (sum(alone) / len(alone))


def stage_sum(r: dict) -> float:
    return sum(r["stages"].values()) + sum(v for tr in r["targets"].values() for k, v in tr.items()
                                           if isinstance(v, float) and k != "vela_alone_cpu_s")


def render(runs: dict[tuple[str, str], dict]) -> str:
    targets = sorted({tg for r in runs.values() for tg in r.get("targets", {})})
    loads = [r["load"] for r in runs.values() if "load" in r]
    load = f"load average {min(loads):.1f}-{max(loads):.1f} during the runs, " if loads else ""
    lines = [f"Cold `npubuild build` of each real spec ({', '.join(targets)}), the trees interleaved ({load}"
             f"{os.cpu_count()} cores). CPU s: user + system of the process tree; stage s: each stage record's wall "
             "seconds; vela: the stage's s per target (Vela alone's CPU s on the same TOSA); npu-sim: the stage's s "
             "over the targets; beyond check: the build's CPU s less the check's share, per target, over Vela "
             "alone's (x: ratio; second figure also without npu-sim).", "",
             "| model | tree | wall s | CPU s | " + " | ".join(SHOWN) + " | check's share | "
             + " | ".join(f"vela {tg}" for tg in targets) + " | npu-sim | beyond check / Vela |",
             "|---|---|---:|---:|" + "---:|" * len(SHOWN) + "---:|" + "---:|" * len(targets) + "---:|---:|"]
    for (m, t), r in runs.items():
        if "error" in r:
            lines.append(f"| {m} | {t} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | failed: {' '.join(r['error'])[:80]} |")
            continue
        st = r["stages"]
        why = next((tr["error"] for tr in r["targets"].values() if tr.get("error")), "")
        if not st:  # no stage of the spec's ran to the end: nothing to time
            lines.append(f"| {m} | {t} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | failed: {why[:80] or 'no stage finished'} |")
            continue
        failed = [tg for tg, tr in r["targets"].items() if tr.get("status") != "passed"]
        if failed:  # every stage ran, a gate or a later stage failed: still a whole compile's time
            m = f"{m} ({len(failed)} failed{': ' + why[:60] if why else ''})"
        total = stage_sum(r)
        share = st.get("tosa-check", 0.0) / total if total else 0.0
        cells = []
        for tg in targets:
            tr = r["targets"].get(tg, {})
            alone = tr.get("vela_alone_cpu_s")
            cells.append(f"{tr.get('vela', 0.0):.1f} ({alone:.2f})" if alone is not None else
                         f"{tr.get('vela', 0.0):.1f} (-)")
        sim = sum(tr.get("npu-sim", 0.0) for tr in r["targets"].values())
        ratios = [beyond_check(r), beyond_check(r, ("npu-sim",))]
        lines.append(f"| {m} | {t} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     + " | ".join(f"{st.get(s, 0.0):.1f}" for s in SHOWN) + f" | {share:.0%} | " + " | ".join(cells)
                     + f" | {sim:.1f} | " + " / ".join(f"{x:.1f}x" if x is not None else "-" for x in ratios) + " |")
    lines += ["", "Over all specs per tree (the specs whose stages ran in every tree): CPU s, the check's seconds over the stages' "
              "sum, the geometric mean of beyond check / Vela:", "", "| tree | specs | CPU s | tosa-check s / stages s "
              "| check's share | beyond check / Vela (geomean) | without npu-sim |", "|---|---:|---:|---:|---:|---:|---:|"]
    trees = list(dict.fromkeys(t for _, t in runs))
    ok = [m for m in dict.fromkeys(m for m, _ in runs)
          if all((m, t) in runs and runs[(m, t)].get("stages") for t in trees)]
    for t in trees:
        rs = [runs[(m, t)] for m in ok if (m, t) in runs]
        check, total = sum(r["stages"].get("tosa-check", 0.0) for r in rs), sum(stage_sum(r) for r in rs)
        geo = [geomean([beyond_check(r, w) for r in rs]) for w in ((), ("npu-sim",))]
        lines.append(f"| {t} | {len(rs)} | {sum(r['cpu_s'] for r in rs):.1f} | {check:.1f} / {total:.1f} | "
                     f"{check / total if total else 0:.0%} | " + " | ".join(f"{g:.2f}x" for g in geo) + " |")
    return "\n".join(lines + render_runs(runs)) + "\n"


def render_runs(runs: dict[tuple[str, str], dict]) -> list[str]:
    """Where the CPU goes between compiling and running models (builds clocked with --clock-runs only)."""
    clocked = {k: r for k, r in runs.items() if r.get("runs") is not None and r.get("stages")}
    if not clocked:
        return []
    lines = ["", "The same builds split by bench/runclock: process CPU s inside onnxruntime runs, TOSA reference-model "
             "runs (by the stage that made them) and npu-sim's simulation (a run of the deployable on the virtual "
             "device, over the targets, with the reference-model runs it makes). Beyond runs: the build's CPU less all "
             "of these, per target, over Vela alone's:", "",
             "| model | tree | CPU s | onnxruntime runs (quantize / other) | reference-model runs (lower / tosa-check "
             "/ other) | npu-sim | Vela compiles: count, CPU s (lower's measured choices / vela stage) | beyond runs s "
             "per target | beyond runs / Vela |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (m, t), r in clocked.items():
        ort_runs, ref = r["runs"].get("onnxruntime", {}), r["runs"].get("reference-model", {})
        tr = r["targets"].values()
        sim = sum(r["runs"].get("npu-sim", {}).values())
        ratio = beyond_runs(r)
        alone = [x["vela_alone_cpu_s"] for x in tr if x.get("vela_alone_cpu_s")]
        per_target = ratio * sum(alone) / len(alone) if ratio is not None else None
        q = ort_runs.get("quantize", 0.0)
        vela = r["runs"].get("vela", {})
        count = r.get("vela_compiles", {})
        compiles = (f"{count.get('lower', 0)} / {count.get('vela', 0)}: {vela.get('lower', 0.0):.1f} / "
                    f"{vela.get('vela', 0.0):.1f}") if vela else "-"
        lines.append(f"| {m} | {t} | {r['cpu_s']:.1f} | {q:.1f} / {sum(ort_runs.values()) - q:.1f} | "
                     + " / ".join(f"{ref.get(s, 0.0):.1f}" for s in ("lower", "tosa_check"))
                     + f" / {sum(v for k, v in ref.items() if k not in ('lower', 'tosa_check')):.1f} | "
                     f"{sim:.1f} | {compiles} | " + (f"{per_target:.2f} | {ratio:.1f}x |" if ratio is not None else "- | - |"))
    lines += ["", "| tree | specs | beyond runs / Vela (geomean) |", "|---|---:|---:|"]
    for t in dict.fromkeys(t for _, t in clocked):
        ratios = [beyond_runs(r) for (_, tt), r in clocked.items() if tt == t]
        lines.append(f"| {t} | {len(ratios)} | {geomean(ratios):.2f}x |")
    return lines


def geomean(xs: list[float | None]) -> float:
    vals = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in vals) / len(vals)) if vals else float("nan")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path)
    ap.add_argument("--tree", action="append", metavar="NAME=PATH")
    ap.add_argument("--only", nargs="*", help="spec names")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--clock-runs", action="store_true",
                    help="also clock the CPU inside model runs (bench/runclock): the build beyond every run")
    ap.add_argument("--replay", type=Path, help="a previous run's printed output: render its table again")
    args = ap.parse_args(argv)
    runs: dict[tuple[str, str], dict] = {}
    if args.replay:
        for line in args.replay.read_text().splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[2].startswith("{"):
                runs[(parts[0], parts[1])] = json.loads(parts[2])
    else:
        if args.real is None:
            ap.error("--real is required (or --replay)")
        run_all(args, runs)
    md = render(runs)
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


def run_all(args: argparse.Namespace, runs: dict[tuple[str, str], dict]) -> None:
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(ROOT)}
    trees = {k: Path(v).resolve() for k, v in trees.items()}
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "npubuild")], check=True,
                       capture_output=True)
    specs = sorted(p for p in (args.real / "specs").glob("*.yaml") if not args.only or p.stem in args.only)
    for t, tree in trees.items():
        print(t, "runs", check_tree(tree, args.real), flush=True)
    with tempfile.TemporaryDirectory(prefix="npb-compile-real-") as tmp:
        for spec in specs:
            for t, tree in trees.items():
                runs[(spec.stem, t)] = build_once(spec, tree, Path(tmp), args.clock_runs)
                runs[(spec.stem, t)]["load"] = os.getloadavg()[0]
                print(spec.stem, t, json.dumps(runs[(spec.stem, t)]), flush=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
