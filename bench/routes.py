"""npubuild beside the two routes users take today, on every example and three targets: one command, one table.

    PYTHONPATH=. /work/main/.venv/bin/python bench/routes.py --work /tmp/routes --out bench/routes.md

A benchmark script, not part of npubuild. It
1. copies configs/ into a scratch project under --work with every spec's `targets:` set to TARGETS and builds it
   with npubuild (this checkout, -n 2): npubuild's figures, .ini files and Vela options;
2. runs bench/tflite_route.py in the onnx2tf venv (--tflite-venv, onnx2tf 1.29.24) and
   bench/executorch_route.py in the ExecuTorch venv (--et-venv, executorch[ethos-u] 1.5.1 + torch 2.13.0 CPU);
   both compile with npubuild's Vela 5.2 and options and Vela's named configs (bench/peer_vela.py);
3. recompiles every npubuild build's own TOSA with Vela's bundled vela.ini and the named config its profile
   mirrors, and checks the inference time is the one npubuild reported through its own .ini;
4. writes one Markdown table (inference ms, SRAM, off-chip, CPU ops, compile s, per route), npubuild / best
   route per build, and the geometric mean of that ratio per target family.

compile s is per build as if compiled alone: npubuild's import + quantize + lower + vela stage seconds (shared
stages counted for each target; the build runs two tasks at a time on a shared machine, so they are upper
bounds), onnx2tf + TFLite converter + Vela, ExecuTorch's export + PT2E quantize + lower (with its own Vela) +
Vela 5.2. None of them counts interpreter start-up.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_vela  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"]
COMPILE_STAGES = ("import", "quantize", "lower", "vela")
ROUTES = ("npubuild", "tflite", "executorch")
# examples built by npubuild only: a host node makes the NPU times of every route leave out the host's share,
# so the peers' figures would not compare (and ExecuTorch's export of them is slow)
NPUBUILD_ONLY = {"alexnet_lrn": "the host-fallback example (its int8 LRN runs on the host): peers not run"}


def make_project(work: Path, targets: list[str]) -> Path:
    """configs/ copied under work/project, every spec building for `targets` (a dodo.py marks the project)."""
    project = work / "project"
    if project.exists():
        shutil.rmtree(project)
    shutil.copytree(ROOT / "configs", project / "configs")
    (project / "dodo.py").write_text("# bench/routes.py scratch project marker\n")
    for spec in (project / "configs").glob("*.yaml"):
        text, n = re.subn(r"^targets: \[.*\]$", f"targets: [{', '.join(targets)}]", spec.read_text(), flags=re.M)
        if n != 1:
            raise RuntimeError(f"{spec.name}: expected one `targets: [...]` line")
        spec.write_text(text)
    return project


def run(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    with open(log, "w") as f:
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, check=False)
    if proc.returncode not in (0, 1):  # 1: a build or gate fell short, the figures are still there
        raise RuntimeError(f"{cmd[1]} exited {proc.returncode}, see {log}")


def npubuild_rows(report: dict) -> list[dict]:
    rows = []
    for e in report["builds"]:
        m = e.get("metrics") or {}
        stages = e.get("stages") or {}
        secs = [stages.get(s, {}).get("seconds") for s in COMPILE_STAGES]
        rows.append({"model": e["model"], "target": e["target"], "route": "npubuild", "status": e["status"],
                     "inference_ms": m.get("inference_ms"), "sram_kib": m.get("sram_kib"),
                     "offchip_kib": m.get("offchip_kib"), "cpu_ops": m.get("cpu_ops"),
                     "npu_cycles": m.get("npu_cycles"), "quant_snr_db": m.get("quant_snr_db"),
                     "bound_ms": m.get("bound_ms"), "efficiency": m.get("efficiency"), "roofline": m.get("roofline"),
                     "compile_s": round(sum(secs), 3) if all(s is not None for s in secs) else None})
    return rows


def named_config_check(report: dict, build_dir: Path, work: Path) -> dict[tuple[str, str], float]:
    """Per build: Vela's inference ms on npubuild's own TOSA through Vela's bundled .ini and named config."""
    from npubuild.config.accelerator import Accelerator
    from npubuild.ethosu.vela import npu_partitions
    from npubuild.records.lower import LowerRecord

    out = {}
    for e in report["builds"]:
        if "tosa" not in e.get("artifacts", {}):
            continue
        lower_dir = Path(e["artifacts"]["tosa"]).parent
        acc = e.get("accelerator") or e["target"]
        fam = Accelerator.parse(acc).lowering_family
        stage = peer_vela.vela_stage_dir(e, build_dir)
        parts = [peer_vela.vela(tosa, acc, peer_vela.vela_options(stage / "stage.json"),
                                work / "named" / f"{e['model']}-{e['target']}-{i}")
                 for i, tosa, _ in npu_partitions(LowerRecord.read(lower_dir / "io.json"), lower_dir, fam)]
        out[(e["model"], e["target"])] = peer_vela.combine(parts)["inference_ms"]
    return out


def fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def best_peer(peers: list[dict], whole_graph_only: bool = False) -> dict | None:
    """The fastest peer by Vela's NPU time; whole_graph_only: among those leaving nothing on the CPU (a route that
    does leaves host time Vela does not count)."""
    ok = [p for p in peers if p.get("inference_ms") is not None and not (whole_graph_only and p.get("cpu_ops"))]
    return min(ok, key=lambda p: p["inference_ms"]) if ok else None


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def regenerate_command(args: argparse.Namespace) -> str:
    """The command line that made this table, venv flags included (their defaults are scratch paths)."""
    targets = [] if args.targets == TARGETS else ["--targets", *args.targets]
    return " ".join(["PYTHONPATH=. /work/main/.venv/bin/python bench/routes.py", "--work", str(args.work),
                     "--tflite-venv", str(args.tflite_venv), "--et-venv", str(args.et_venv), *targets,
                     "--out", str(args.out or "bench/routes.md")])


def reuse_note(args: argparse.Namespace) -> str:
    """What this render did not remake (--skip), so reused columns do not pass for fresh ones."""
    if not args.skip:
        return ""
    return (f" This render ran it with `--skip {' '.join(args.skip)}`: those steps' results (their columns, compile "
            f"seconds included) are the ones already in {args.work}.")


def table(rows: dict[tuple[str, str, str], dict], named: dict[tuple[str, str], float], command: str,
          note: str = "") -> str:
    builds = sorted({(m, t) for m, t, _ in rows}, key=lambda k: (k[0], TARGETS.index(k[1]) if k[1] in TARGETS else 9))
    head = ("| model | target | inference ms | best route | npubuild / best | SRAM KiB | off-chip KiB | CPU ops | "
            "compile s | quant SNR dB | named-config ms |")
    lines = [f"Regenerate: `{command}` (bench/routes.py says what each route runs; the venvs: "
             f"bench/tflite_route.py's and bench/executorch_route.py's docstrings).{note}", "",
             "Each cell: npubuild / onnx2tf -> TFLite int8 / ExecuTorch 1.5.1 Arm backend (Vela 5.2, same options; "
             "`-` where the route failed, reason below).", "", head, "|---|---|---|---|---:|---|---|---|---|---|---:|"]
    ratios: dict[str, list[float]] = {}
    whole: dict[str, list[float]] = {}
    wins: list[str] = []
    over: list[str] = []  # the acceptance's "SRAM and off-chip no worse than the better route", where it fails
    notes: list[str] = []
    for model, target in builds:
        r = [rows.get((model, target, route), {}) for route in ROUTES]
        npb, peers = r[0], [p for p in r[1:] if p]
        best = best_peer(peers)
        ratio = npb["inference_ms"] / best["inference_ms"] if best and npb.get("inference_ms") else None
        if ratio is not None:
            ratios.setdefault(target.split("-")[1], []).append(ratio)
        best_whole = best_peer(peers, whole_graph_only=True)
        if best_whole and npb.get("inference_ms"):
            whole.setdefault(target.split("-")[1], []).append(npb["inference_ms"] / best_whole["inference_ms"])
        if best and npb.get("inference_ms"):
            more = [f"{what} +{npb[key] - best[key]:.2f} KiB ({npb[key]:.2f} vs {best[key]:.2f})"
                    for what, key in (("SRAM", "sram_kib"), ("off-chip", "offchip_kib"))
                    if npb.get(key) is not None and best.get(key) is not None and npb[key] > best[key] + 0.005]
            if more:
                over.append(f"- {model} / {target}, against {best['route']}{'*' if best.get('cpu_ops') else ''}: "
                            + ", ".join(more))
        et = r[2]
        if et.get("inference_ms") is not None and npb.get("inference_ms") and et["inference_ms"] < npb["inference_ms"]:
            host = f"; ExecuTorch leaves {et['cpu_ops']} ops on the CPU, not counted" if et.get("cpu_ops") else ""
            wins.append(f"- {model} / {target}: ExecuTorch {et['inference_ms']:.4f} ms vs npubuild "
                        f"{npb['inference_ms']:.4f} ms (npubuild +{100 * (npb['inference_ms'] / et['inference_ms'] - 1):.1f}%"
                        f"{host})")
        if model in NPUBUILD_ONLY and f"- {model}: {NPUBUILD_ONLY[model]}" not in notes:
            notes.append(f"- {model}: {NPUBUILD_ONLY[model]}")
        for route, p in zip(ROUTES[1:], r[1:], strict=True):
            if p.get("error"):
                notes.append(f"- {model} / {target}, {route}: {p['error']}")
            if p.get("snr_error"):
                notes.append(f"- {model} / {target}, {route}: compiled, accuracy not measured: {p['snr_error']}")
            if p.get("cpu_op_names"):
                notes.append(f"- {model} / {target}, {route} leaves on the CPU: {', '.join(p['cpu_op_names'])}")

        def cells(key: str, digits: int = 2, rr=r) -> str:
            return " / ".join(fmt(p.get(key), digits) for p in rr)

        named_ms = named.get((model, target))
        check = "" if named_ms is None or npb.get("inference_ms") is None else (
            f"{named_ms:.4f}" + ("" if abs(named_ms - npb["inference_ms"]) < 5e-6 else " (differs!)"))
        lines.append(f"| {model} | {target} | {cells('inference_ms', 4)} | "
                     f"{(best['route'] + ('*' if best.get('cpu_ops') else '')) if best else '-'} | {fmt(ratio, 3)} | {cells('sram_kib')} | "
                     f"{cells('offchip_kib')} | {cells('cpu_ops')} | {cells('compile_s', 1)} | "
                     f"{cells('quant_snr_db', 1)} | {check} |")
    lines += ["", "`*`: the best route leaves ops on the CPU (its NPU time excludes them).", "",
              "Geometric mean of npubuild / best route (inference time), per target family (in brackets: against "
              "the best route that runs the whole graph on the NPU):", ""]
    # four digits: the acceptance's 0.85 is a bound a ratio can meet by less than the third digit shows
    lines += [f"- {fam}: {geomean(xs):.4f} ({geomean(whole.get(fam, [])) or float('nan'):.4f}) over {len(xs)} builds"
              for fam, xs in sorted(ratios.items())]
    lines += [f"- all: {geomean([x for xs in ratios.values() for x in xs]):.4f} "
              f"({geomean([x for xs in whole.values() for x in xs]):.4f})"]
    lines += ["", "Where ExecuTorch's route is faster than npubuild:", ""] + (wins or ["- nowhere"])
    lines += ["", f"Where npubuild uses more SRAM or off-chip memory than the best route ({len(over)} builds; "
              "bench/perf_choices.md says what each costs and buys):", ""] + (over or ["- nowhere"])
    if notes:
        lines += ["", "Route notes:", ""] + notes
    return "\n".join(lines) + "\n"


def roofline_section(rows: dict[tuple[str, str, str], dict]) -> str:
    """npubuild's roofline per build (metrics.bound_ms, efficiency, roofline): how far each is from the limit."""
    lines = ["", "## npubuild's roofline per build", "",
             "Bound = sum over Vela's layers of max(MACs / peak MACs, data bytes moved per memory / its peak bandwidth; "
             "data = Vela's bytes less its burst overhead); "
             "efficiency = bound / Vela's estimate. Worst layer: the largest estimate - bound.", "",
             "| model | target | estimated ms | bound ms | efficiency | MAC-bound ms | memory-bound ms | "
             "layers bound by | worst layer (estimated vs bound ms) |", "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for (model, target, route), r in sorted(rows.items()):
        roof = r.get("roofline")
        if route != "npubuild" or not roof:
            continue
        w = roof["worst_layers"][0] if roof["worst_layers"] else None
        worst = (f"{w.get('onnx_node') or w['tensor']} {w.get('npu_op')} ({w['estimated_ms']:.4f} vs "
                 f"{w['bound_ms']:.4f}, {w['bound_by']})" if w else "-")
        by = ", ".join(f"{k} {v}" for k, v in roof["layers_bound_by"].items())
        lines.append(f"| {model} | {target} | {r['inference_ms']:.4f} | {r['bound_ms']:.4f} | {r['efficiency']:.2f} | "
                     f"{roof['mac_bound_ms']:.4f} | {roof['memory_bound_ms']:.4f} | {by} | {worst} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/routes"))
    ap.add_argument("--out", type=Path, help="write the Markdown here (bench/routes.md)")
    ap.add_argument("--tflite-venv", type=Path, default=Path("/tmp/tflite-venv"))
    ap.add_argument("--et-venv", type=Path, default=Path("/tmp/et-venv"))
    ap.add_argument("--targets", nargs="+", default=TARGETS)
    ap.add_argument("--only", nargs="*", help="model names (peers only; npubuild builds every example)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["build", "tflite", "executorch"],
                    help="reuse the previous run's results in --work for these steps")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    build_dir = args.work / "npb"
    report_path = build_dir / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if "build" not in args.skip:
        project = make_project(args.work, args.targets)
        run([sys.executable, "-m", "npubuild", "build", "configs", "--build-dir", str(build_dir), "-n", "2",
             "--keep-going"], args.work / "npubuild.log", env, project)
    built = sorted({e["model"] for e in json.loads(report_path.read_text())["builds"]})
    peer_models = [m for m in (args.only or built) if m not in NPUBUILD_ONLY]
    only = ["--only", *peer_models]
    models = ["--models", str(args.work / "project" / "configs" / "models")]
    if "tflite" not in args.skip:
        tfl_env = {**env, "PATH": f"{args.tflite_venv / 'bin'}:{os.environ['PATH']}"}
        run([str(args.tflite_venv / "bin" / "python"), str(ROOT / "bench" / "tflite_route.py"), "--report",
             str(report_path), "--work", str(args.work / "tflite"), "--json", str(args.work / "tflite.json"),
             *models, *only], args.work / "tflite.log", tfl_env)
    if "executorch" not in args.skip:
        run([str(args.et_venv / "bin" / "python"), str(ROOT / "bench" / "executorch_route.py"), "--report",
             str(report_path), "--work", str(args.work / "executorch"), "--json", str(args.work / "executorch.json"),
             *models, *only], args.work / "executorch.log", env)
    report = json.loads(report_path.read_text())
    rows: dict[tuple[str, str, str], dict] = {}
    for r in npubuild_rows(report):
        rows[(r["model"], r["target"], "npubuild")] = r
    for route, name in (("tflite", "tflite.json"), ("executorch", "executorch.json")):
        path = args.work / name
        for r in json.loads(path.read_text()) if path.exists() else []:
            if "failed" in r.get("route", ""):
                r["error"] = r["route"].split("(failed: ", 1)[-1].removesuffix(")")  # the reason's own ")" stays
            rows[(r["model"], r["target"], route)] = {**r, "route": route}
    named = named_config_check(report, build_dir, args.work)
    md = table(rows, named, regenerate_command(args), reuse_note(args)) + roofline_section(rows)
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
