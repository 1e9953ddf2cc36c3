"""`optimise: size` beside the default on every example and target, against the best peer route's memory.

    PYTHONPATH=. .venv/bin/python bench/size_mode.py --work /tmp/size --out bench/size_mode.md

A benchmark script, not part of npubuild. It copies configs/ into a scratch project twice (every spec's targets
set to TARGETS; the second copy with `optimise: size` added to every spec), builds both with this checkout and
prints per build the inference ms, SRAM and off-chip KiB of each mode, beside the best peer route's figures as
bench/routes.md has them (the fastest of onnx2tf -> TFLite int8 and ExecuTorch, same Vela and named configs;
run bench/routes.py to refresh those).
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
    lines = ["Regenerate: `PYTHONPATH=. .venv/bin/python bench/size_mode.py --work /tmp/size --out bench/size_mode.md` "
             "(peers: bench/routes.md).", "",
             "| model | target | ms perf / size | SRAM KiB perf / size / best route | off-chip KiB perf / size / best "
             "route | size mode over the best route |", "|---|---|---|---|---|---|"]
    over, count = [], 0
    for key in sorted(runs["performance"]):
        p, s, b = runs["performance"][key], runs["size"].get(key, {}), best.get(key)

        def f(v, d=2):
            return "-" if v is None else f"{v:.{d}f}"

        verdict = "no peer"
        if b and s.get("sram_kib") is not None:
            count += 1
            more = [k for k in ("sram_kib", "offchip_kib") if b[k] is not None and s[k] > b[k] + 0.005]
            verdict = "no worse" if not more else "over: " + ", ".join(f"{k} +{s[k] - b[k]:.2f}" for k in more)
            if more:
                over.append(f"- {key[0]} / {key[1]}: {verdict}")
        lines.append(f"| {key[0]} | {key[1]} | {f(p.get('inference_ms'), 4)} / {f(s.get('inference_ms'), 4)} | "
                     f"{f(p.get('sram_kib'))} / {f(s.get('sram_kib'))} / {f(b and b['sram_kib'])} | "
                     f"{f(p.get('offchip_kib'))} / {f(s.get('offchip_kib'))} / {f(b and b['offchip_kib'])} | {verdict} |")
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
