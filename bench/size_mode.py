"""`optimise: size` beside the default on every example and target, against the best peer route's memory.

    PYTHONPATH=. .venv/bin/python bench/size_mode.py --work /tmp/size --out bench/size_mode.md

A benchmark script, not part of npubuild. It copies configs/ into a scratch project twice (every spec's targets
set to TARGETS; the second copy with `optimise: size` added to every spec), builds both with this checkout and
prints per build the inference ms, SRAM and off-chip KiB of each mode, beside the best peer route's figures as
bench/routes.md has them (the fastest of onnx2tf -> TFLite int8 and ExecuTorch, same Vela and named configs;
run bench/routes.py to refresh those).

Two verdicts per build, side by side. "Vela only": size mode's SRAM and off-chip against the route's Vela
figures, as routes.md has them. "CPU part counted": where that route is ExecuTorch's and it leaves ops on the
CPU, Vela counts neither the CPU kernels' code nor their memory, so the route's figures get both: the memory
ExecuTorch plans for the CPU part (the tensors handed to and from the CPU ops, their float outputs:
bench/executorch_cpu_memory.py, ExecuTorch's own memory plan without the graph's input and output) added to its
SRAM where its named memory mode keeps the arena in SRAM (U55's Shared_Sram), else to its off-chip figure (U65 /
U85: Dedicated_Sram); and the CPU kernels' code flash (bench/executorch_cpu_code.py: the kernels compiled for
Cortex-M55 with -Os, linked with --gc-sections, logging off, the ExecuTorch runtime itself not counted) added
to its off-chip figure. npubuild's own firmware code is counted in neither verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"]


def project(work: Path, name: str, size: bool) -> Path:
    proj = work / name
    if proj.exists():
        shutil.rmtree(proj)
    shutil.copytree(ROOT / "configs", proj / "configs")
    (proj / "dodo.py").write_text("# bench/size_mode.py scratch project marker\n")
    for spec in (proj / "configs").glob("*.yaml"):
        text = re.sub(r"^targets: \[.*\]$", f"targets: [{', '.join(TARGETS)}]", spec.read_text(), flags=re.M)
        if size:
            text = re.sub(r"^(targets: .*)$", r"\1\noptimise: size", text, count=1, flags=re.M)
        spec.write_text(text)
    return proj


def build(proj: Path, log: Path) -> dict[tuple[str, str], dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as f:
        subprocess.run(["nice", "-n", "10", sys.executable, "-m", "npubuild", "build", "configs", "--build-dir",
                        str(proj / "build"), "-n", "2", "--keep-going", "-q"], cwd=proj, env=env, stdout=f,
                       stderr=subprocess.STDOUT, check=False)
    report = json.loads((proj / "build" / "report.json").read_text())
    return {(e["model"], e["target"]): e["metrics"] for e in report["builds"]}


def peers(routes_md: Path) -> dict[tuple[str, str], dict]:
    """The best route's figures per example build, from bench/routes.md's table."""
    out = {}
    for line in routes_md.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or cells[1] not in TARGETS or cells[3] in ("-", "best route"):
            continue
        route = cells[3].rstrip("*")
        at = {"tflite": 1, "executorch": 2}.get(route)
        if at is None:
            continue

        def pick(cell: str, at: int = at) -> float | None:
            parts = [p.strip() for p in cell.split("/")]
            return float(parts[at]) if parts[at] != "-" else None

        out[(cells[0], cells[1])] = {"route": cells[3], "inference_ms": pick(cells[2]), "sram_kib": pick(cells[5]),
                                     "offchip_kib": pick(cells[6])}
    return out


def with_cpu_part(best: dict[tuple[str, str], dict], planned: Path, code: Path) -> dict[tuple[str, str], dict]:
    """The ExecuTorch route's figures with its CPU part counted, for each build in `best` whose route leaves ops on
    the CPU: planned CPU memory (bench/executorch_cpu_memory.json) added to the figure it lives in, the CPU
    kernels' code flash (bench/executorch_cpu_code.json, its `counted_by_size_mode` build) added to off-chip.
    Values: {"sram_kib", "offchip_kib", "cpu_mem_kib", "cpu_mem_in", "cpu_code_kib"}."""
    rows = json.loads(planned.read_text()) if planned.exists() else []
    code_of: dict[str, int] = {}
    if code.exists():
        measured = json.loads(code.read_text())
        for s in measured["sets"]:
            for m in s["models"]:
                code_of[m] = s[measured["counted_by_size_mode"]]["flash"]
    out = {}
    for r in rows:
        key = (r["model"], r["target"])
        b = best.get(key)
        if b is None or not b["route"].startswith("executorch") or b[r["adds_to"]] is None:
            continue
        mem, flash = r["planned_bytes"] / 1024, code_of.get(r["model"])
        if flash is None:
            sys.exit(f"error: no CPU code measured for {r['model']} in {code} (run bench/executorch_cpu_code.py)")
        counted = {"sram_kib": b["sram_kib"], "offchip_kib": b["offchip_kib"] + flash / 1024}
        counted[r["adds_to"]] += mem
        out[key] = {**counted, "cpu_mem_kib": mem, "cpu_mem_in": r["adds_to"], "cpu_code_kib": flash / 1024}
    return out


def verdict(size: dict, route: dict) -> tuple[str, bool]:
    """("no worse" or "over: ...", over?) for size mode's SRAM and off-chip against a route's."""
    more = [k for k in ("sram_kib", "offchip_kib") if route[k] is not None and size[k] > route[k] + 0.005]
    return ("no worse", False) if not more else ("over: " + ", ".join(f"{k} +{size[k] - route[k]:.2f}" for k in more),
                                                  True)


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/size"))
    ap.add_argument("--out", type=Path)
    ap.add_argument("--skip-build", action="store_true", help="read the previous run's reports in --work")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name, size in (("performance", False), ("size", True)):
        proj = args.work / name
        if not args.skip_build:
            proj = project(args.work, name, size)
            runs[name] = build(proj, args.work / f"{name}.log")
        else:
            report = json.loads((proj / "build" / "report.json").read_text())
            runs[name] = {(e["model"], e["target"]): e["metrics"] for e in report["builds"]}
    best = peers(ROOT / "bench" / "routes.md")
    cpu = with_cpu_part(best, ROOT / "bench" / "executorch_cpu_memory.json",
                        ROOT / "bench" / "executorch_cpu_code.json")
    lines = ["Regenerate: `PYTHONPATH=. .venv/bin/python bench/size_mode.py --work /tmp/size --out bench/size_mode.md` "
             "(peers: bench/routes.md; the ExecuTorch route's CPU part: bench/executorch_cpu_memory.json, "
             "bench/executorch_cpu_code.json).", "",
             "SRAM and off-chip columns: Vela's figures, the best route's as bench/routes.md has them. Where that "
             "route is ExecuTorch's and it leaves ops on the CPU, Vela counts neither the CPU kernels' code nor "
             "their memory; the \"route's CPU part\" column gives both: the CPU kernels' code flash (the kernels "
             "compiled for Cortex-M55 with -Os and linked with --gc-sections, logging off, the ExecuTorch runtime "
             "not counted: bench/executorch_cpu_code.py) and the activation memory ExecuTorch's own memory plan "
             "holds for the CPU part (the tensors handed to and from the CPU ops and their float outputs, the "
             "graph's own input and output left out: bench/executorch_cpu_memory.py), in SRAM on U55 (Shared_Sram), "
             "off-chip on U65 / U85 (Dedicated_Sram); then the route's SRAM / off-chip with both counted (the code "
             "is off-chip flash). Size mode is judged twice: against Vela's figures only, and against the route "
             "with its CPU part counted (npubuild's own firmware code is counted in neither).", "",
             "| model | target | ms perf / size | SRAM KiB perf / size / best route | off-chip KiB perf / size / best "
             "route | route's CPU part: code KiB, planned KiB; route SRAM / off-chip with it | size mode vs the "
             "best route, Vela figures only | size mode vs the best route, CPU part counted |",
             "|---|---|---|---|---|---|---|---|"]
    over, over_cpu, count = [], [], 0
    for key in sorted(runs["performance"]):
        p, s, b, c = runs["performance"][key], runs["size"].get(key, {}), best.get(key), cpu.get(key)

        def f(v, d=2):
            return "-" if v is None else f"{v:.{d}f}"

        def peer(k, b=b):
            return "-" if not b or b[k] is None else f"{b[k]:.2f}"

        vela_only = with_cpu = "no peer"
        part = "-"
        if b and s.get("sram_kib") is not None:
            count += 1
            vela_only, worse = verdict(s, b)
            if worse:
                over.append(f"- {key[0]} / {key[1]}: {vela_only}")
            with_cpu, worse = verdict(s, c) if c else (vela_only, worse)
            if c:
                part = (f"{c['cpu_code_kib']:.2f} code, {c['cpu_mem_kib']:.2f} planned ({c['cpu_mem_in'][:-4]}); "
                        f"{c['sram_kib']:.2f} / {c['offchip_kib']:.2f}")
            if worse:
                over_cpu.append(f"- {key[0]} / {key[1]}: {with_cpu}")
        lines.append(f"| {key[0]} | {key[1]} | {f(p.get('inference_ms'), 4)} / {f(s.get('inference_ms'), 4)} | "
                     f"{f(p.get('sram_kib'))} / {f(s.get('sram_kib'))} / {peer('sram_kib')} | "
                     f"{f(p.get('offchip_kib'))} / {f(s.get('offchip_kib'))} / {peer('offchip_kib')} | {part} | "
                     f"{vela_only} | {with_cpu} |")
    lines += ["", f"Size mode over the best route's SRAM or off-chip, Vela figures only: {len(over)} of {count} builds "
              "with a peer.", ""]
    lines += over or ["- none"]
    lines += ["", f"Size mode over the best route's SRAM or off-chip, the route's CPU part counted: {len(over_cpu)} of "
              f"{count} builds with a peer.", ""]
    lines += over_cpu or ["- none"]
    lines += ["", "Inference time over the best route's (the routes.md ratio with this checkout's npubuild side), "
              "geometric mean per target family, performance / size mode:", ""]
    for fam in ("u55", "u65", "u85"):
        ratios = {mode: [runs[mode][k]["inference_ms"] / b["inference_ms"] for k, b in best.items()
                         if k[1].split("-")[1] == fam and runs[mode].get(k, {}).get("inference_ms") and b["inference_ms"]]
                  for mode in ("performance", "size")}
        if ratios["performance"]:
            worst = max(ratios["performance"])
            lines.append(f"- {fam}: {geomean(ratios['performance']):.3f} / {geomean(ratios['size']):.3f} over "
                         f"{len(ratios['performance'])} builds (performance mode's largest {worst:.3f})")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
