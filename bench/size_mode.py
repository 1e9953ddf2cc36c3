"""`optimise: size` beside the default on every example and target, against the best peer route's memory.

    PYTHONPATH=. .venv/bin/python bench/size_mode.py --work /tmp/size --out bench/size_mode.md

A benchmark script, not part of npubuild. It copies configs/ into a scratch project twice (every spec's targets
set to TARGETS; the second copy with `optimise: size` added to every spec), builds both with this checkout and
prints per build the inference ms, SRAM and off-chip KiB of each mode, beside the best peer route's figures as
bench/routes.md has them (the fastest of onnx2tf -> TFLite int8 and ExecuTorch, same Vela and named configs;
run bench/routes.py to refresh those). Where that route is ExecuTorch's and it leaves ops on the CPU, routes.md's
figures are its Vela delegates' only; the memory ExecuTorch plans beside them for the CPU part (the tensors
handed to and from the CPU ops, their float outputs: bench/executorch_cpu_memory.py, ExecuTorch's own memory
plan without the graph's input and output) is added to the route's SRAM where its named memory mode keeps the
arena in SRAM (U55's Shared_Sram), else to its off-chip figure (U65 / U85: Dedicated_Sram).
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


def with_cpu_memory(best: dict[tuple[str, str], dict], planned: Path) -> dict[tuple[str, str], dict]:
    """`best` with ExecuTorch's planned CPU-side memory added to the ExecuTorch route's figure it lives in
    (bench/executorch_cpu_memory.json); the KiB added under "cpu_kib", the figure under "cpu_in"."""
    rows = json.loads(planned.read_text()) if planned.exists() else []
    out = dict(best)
    for r in rows:
        key = (r["model"], r["target"])
        b = best.get(key)
        if b is None or not b["route"].startswith("executorch") or b[r["adds_to"]] is None:
            continue
        kib = r["planned_bytes"] / 1024
        out[key] = {**b, r["adds_to"]: b[r["adds_to"]] + kib, "cpu_kib": kib, "cpu_in": r["adds_to"]}
    return out


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
    best = with_cpu_memory(peers(ROOT / "bench" / "routes.md"), ROOT / "bench" / "executorch_cpu_memory.json")
    lines = ["Regenerate: `PYTHONPATH=. .venv/bin/python bench/size_mode.py --work /tmp/size --out bench/size_mode.md` "
             "(peers: bench/routes.md; the ExecuTorch route's CPU part: bench/executorch_cpu_memory.json).", "",
             "Best route's memory: its Vela figures (routes.md); where it is ExecuTorch's with ops left on the CPU (`*`), "
             "plus the activation memory ExecuTorch's own memory plan holds for the CPU part (the tensors handed "
             "to and from the CPU ops and their float outputs, the graph's own input and output left out: "
             "bench/executorch_cpu_memory.py), in SRAM on U55 (Shared_Sram), off-chip on U65 / U85 (Dedicated_Sram).",
             "",
             "| model | target | ms perf / size | SRAM KiB perf / size / best route | off-chip KiB perf / size / best "
             "route | size mode over the best route |", "|---|---|---|---|---|---|"]
    over, count = [], 0
    for key in sorted(runs["performance"]):
        p, s, b = runs["performance"][key], runs["size"].get(key, {}), best.get(key)

        def f(v, d=2):
            return "-" if v is None else f"{v:.{d}f}"

        def peer(k, b=b):  # `*`: ExecuTorch's planned CPU-side memory is in this figure
            return "-" if not b or b[k] is None else f"{b[k]:.2f}" + ("*" if b.get("cpu_in") == k else "")

        verdict = "no peer"
        if b and s.get("sram_kib") is not None:
            count += 1
            more = [k for k in ("sram_kib", "offchip_kib") if b[k] is not None and s[k] > b[k] + 0.005]
            verdict = "no worse" if not more else "over: " + ", ".join(f"{k} +{s[k] - b[k]:.2f}" for k in more)
            if more:
                over.append(f"- {key[0]} / {key[1]}: {verdict}")
        lines.append(f"| {key[0]} | {key[1]} | {f(p.get('inference_ms'), 4)} / {f(s.get('inference_ms'), 4)} | "
                     f"{f(p.get('sram_kib'))} / {f(s.get('sram_kib'))} / {peer('sram_kib')} | "
                     f"{f(p.get('offchip_kib'))} / {f(s.get('offchip_kib'))} / {peer('offchip_kib')} | {verdict} |")
    lines += ["", f"Size mode over the best route's SRAM or off-chip: {len(over)} of {count} builds with a peer.", ""]
    lines += over or ["- none"]
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
