"""Cold `npubuild build` of every real trained model's spec, for one or more npubuild trees side by side, beside
Vela alone on the TOSA each target compiled: where a real model's compile time goes, and the TOSA check's share.

    PYTHONPATH=. .venv/bin/python bench/compile_real.py --real <copy of shared/models/real> \
        [--tree before=/path/to/old/tree --tree after=.] [--only NAME ...] [--out bench/compile_real.md]

A benchmark script, not part of npubuild. --real is a writable copy of shared/models/real with its calibration
made (its README says how). Per spec and tree (the trees interleaved, so a load change on the shared machine hits
both alike), in fresh child processes:
- `npubuild build SPEC --build-dir B --cache off` in an empty build dir (cold: every stage runs; the spec's
  three targets, ethos-u55-128 / ethos-u65-256 / ethos-u85-256): wall seconds, CPU seconds (user + system of the
  whole process tree: the figure the load inflates least), and every stage's seconds from its stage record;
- Vela alone (npubuild's own command line and .ini, bench/compile_speed.vela_alone) on the TOSA graph(s) each
  target's vela stage compiled: CPU seconds per target.
The stages shared by the targets (import, quantize, lower, tosa-check) run once a spec; the vela and report
stages once a target. The check's share is the tosa-check stage's seconds over the sum of the stages'.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compile_speed import timed, vela_alone  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("import", "quantize", "lower", "tosa-check")


def build_once(spec: Path, tree: Path, work: Path) -> dict:
    build_dir = work / "build"
    shutil.rmtree(build_dir, ignore_errors=True)
    wall, cpu, proc = timed([sys.executable, "-m", "npubuild", "build", str(spec), "--build-dir", str(build_dir),
                             "--cache", "off", "--keep-going", "-q"], tree, cwd=spec.parent.parent)
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
        try:
            t["vela_alone_cpu_s"] = vela_alone(e, work)[1] if e.get("artifacts", {}).get("vela") else None
        except (RuntimeError, KeyError, FileNotFoundError):
            t["vela_alone_cpu_s"] = None
    return {"wall_s": wall, "cpu_s": cpu, "stages": stages, "targets": per_target}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, required=True)
    ap.add_argument("--tree", action="append", metavar="NAME=PATH")
    ap.add_argument("--only", nargs="*", help="spec names")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(ROOT)}
    trees = {k: Path(v).resolve() for k, v in trees.items()}
    for tree in trees.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "npubuild")], check=True,
                       capture_output=True)
    specs = sorted(p for p in (args.real / "specs").glob("*.yaml") if not args.only or p.stem in args.only)
    runs: dict[tuple[str, str], dict] = {}
    loads = []
    with tempfile.TemporaryDirectory(prefix="npb-compile-real-") as tmp:
        for spec in specs:
            for t, tree in trees.items():
                runs[(spec.stem, t)] = build_once(spec, tree, Path(tmp))
                loads.append(os.getloadavg()[0])
                print(spec.stem, t, json.dumps(runs[(spec.stem, t)]), flush=True)
    targets = sorted({tg for r in runs.values() for tg in r.get("targets", {})})
    lines = [f"Cold `npubuild build` of each real spec ({', '.join(targets)}), the trees interleaved (load average "
             f"{min(loads):.1f}-{max(loads):.1f} during the runs, {os.cpu_count()} cores). CPU s: user + system of "
             "the process tree; stage s: each stage record's wall seconds.", "",
             "| model | tree | wall s | CPU s | import | quantize | lower | tosa-check | check's share | "
             + " | ".join(f"vela {tg} (Vela alone CPU)" for tg in targets) + " |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(targets)]
    for (m, t), r in runs.items():
        if "error" in r:
            lines.append(f"| {m} | {t} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | failed: {' '.join(r['error'])[:80]} |")
            continue
        st = r["stages"]
        total = sum(st.values()) + sum(v for tr in r["targets"].values() for k, v in tr.items()
                                       if isinstance(v, float) and k not in ("vela_alone_cpu_s",))
        share = st.get("tosa-check", 0.0) / total if total else 0.0
        cells = []
        for tg in targets:
            tr = r["targets"].get(tg, {})
            alone = tr.get("vela_alone_cpu_s")
            cells.append(f"{tr.get('vela', 0.0):.1f} ({alone:.2f})" if alone is not None else
                         f"{tr.get('vela', 0.0):.1f} (-)")
        lines.append(f"| {m} | {t} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                     + " | ".join(f"{st.get(s, 0.0):.1f}" for s in SHARED) + f" | {share:.0%} | " + " | ".join(cells)
                     + " |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
