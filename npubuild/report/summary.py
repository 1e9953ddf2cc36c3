"""report.json / report.md for a whole run: one entry per spec x model x target.

Built after the task graph ran, from the stage records on disk, so it is the
same whichever executor ran the stages; `cached` is true for a stage whose
record comes from an earlier run.
"""

from __future__ import annotations

import json
from pathlib import Path

from npubuild.build.execute import read_error
from npubuild.build.plan import BuildPlan
from npubuild.build.uptodate import read_record
from npubuild.build.versions import all_versions
from npubuild.fileio import _json_default, write_text
from npubuild.report.html import write_html
from npubuild.report.numerics import numerics_markdown, stored_layers
from npubuild.report.offloads import placement_markdown


def build_entries(plan: BuildPlan, run_id: str) -> list[dict]:
    entries = []
    for b in plan.builds:
        chain = plan.build_tasks[b.id]
        stages: dict[str, dict] = {}
        errors: list[str] = []
        error_kinds: set[str] = set()
        entry_metrics: dict = {}
        gates: list[dict] = []
        records: dict[str, dict] = {}
        for stage, name in chain.items():
            task = plan.tasks[name]
            rec = read_record(task)
            if rec is not None:
                records[stage] = rec
                stages[stage] = {"status": "passed", "seconds": rec["seconds"], "cached": rec["run_id"] != run_id,
                                 "from_cache": bool(rec.get("from_cache"))}
                if stage == "report":
                    entry_metrics, gates = rec["metrics"]["metrics"], rec["metrics"]["gates"]
                if isinstance(rec.get("metrics"), dict) and rec["metrics"].get("skipped") is True:
                    stages[stage].update(status="skipped", reason=rec["metrics"].get("reason", ""))
                continue
            err = read_error(task)
            if err is not None:
                stages[stage] = {"status": "failed", "seconds": None, "cached": False, "error": err["message"]}
                errors.append(err["message"])
                error_kinds.add(err.get("kind", "stage"))
            else:
                stages[stage] = {"status": "skipped", "seconds": None, "cached": False}
        for stage, reason in plan.skipped.get(b.id, {}).items():  # decided when the plan was made
            stages[stage] = {"status": "skipped", "seconds": None, "cached": False, "reason": reason}
        if errors:
            status = "failed"
        elif any(s["status"] == "skipped" for k, s in stages.items() if k != "fvp" and "reason" not in s):
            status = "skipped"
        elif any(not g["ok"] for g in gates):
            status = "failed"
        else:
            status = "passed"
        entries.append({
            "spec": b.spec.name,
            "model": b.model_name,
            "target": b.target.name,
            "accelerator": b.target.accelerator,
            "status": status,
            "stages": stages,
            "metrics": entry_metrics,
            "gates": gates,
            "errors": errors,
            "error_kinds": sorted(error_kinds),
            "artifacts": artifacts(plan, b.id, records),
            **stored_layers(plan.build_dir, b.id, records.get("lower", {}).get("cache_key")),
        })
    return entries


def artifacts(plan: BuildPlan, build_id: str, records: dict[str, dict] | None = None) -> dict[str, str]:
    """Paths of the build's main outputs; the Vela files from its stage record (no directory scan per build)."""
    chain = plan.build_tasks[build_id]
    out = {}
    lower = plan.tasks[chain["lower"]]
    out["tosa"] = str(lower.outputs["tosa"])
    vela = plan.tasks[chain["vela"]] if "vela" in chain else None
    if vela is None:
        return out
    names = ((records or {}).get("vela") or {}).get("metrics", {}).get("artifacts")
    if isinstance(names, list):
        found = [vela.dir / n for n in sorted(n for n in names if n.endswith("_vela.tflite"))]
        found += [vela.dir / n for n in sorted(n for n in names if n.endswith("_vela.npz"))]
    else:
        found = sorted(vela.dir.glob("*_vela.tflite")) + sorted(vela.dir.glob("*_vela.npz"))
    for p in found:
        out["vela"] = str(p)
    return out


def write_reports(plan: BuildPlan, run_id: str, build_dir: Path) -> dict:
    report = {"versions": all_versions(), "builds": build_entries(plan, run_id)}
    # compact: json's C encoder only runs without indent, and report.json of a nightly matrix is megabytes
    write_text(build_dir / "report.json", json.dumps(report, default=_json_default) + "\n")
    write_text(build_dir / "report.md", render_markdown(report))
    write_html(build_dir / "report.html", report, cache_dir=build_dir / ".cache" / "plots")
    return report


def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def render_markdown(report: dict) -> str:
    lines = ["# npubuild report", "",
             "| spec | model | target | status | NPU ops | CPU ops | SRAM KiB | off-chip KiB | inference ms | "
             "NPU cycles | TOSA max LSB | TOSA SNR dB | quant SNR dB | cached stages |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for b in report["builds"]:
        m = b["metrics"]
        cached = sum(1 for s in b["stages"].values() if s.get("cached"))
        ran = sum(1 for s in b["stages"].values() if s["status"] == "passed")
        lines.append(
            f"| {b['spec']} | {b['model']} | {b['target']} | {b['status']} | {_fmt(m.get('npu_ops'))} | "
            f"{_fmt(m.get('cpu_ops'))} | {_fmt(m.get('sram_kib'))} | {_fmt(m.get('offchip_kib'))} | "
            f"{_fmt(m.get('inference_ms'), 4)} | {_fmt(m.get('npu_cycles'))} | {_fmt(m.get('tosa_max_error_lsb'), 0)} | "
            f"{_fmt(m.get('tosa_snr_db'), 1)} | {_fmt(m.get('quant_snr_db'), 1)} | {cached}/{ran} |")
    lines += _gates_and_memory(report)
    lines += _roofline(report)
    lines += numerics_markdown(report["builds"])
    failures = [(b, g) for b in report["builds"] for g in b["gates"] if not g["ok"]]
    errors = [(b, e) for b in report["builds"] for e in b["errors"]]
    if failures or errors:
        lines += ["", "## Problems", ""]
        for b, g in failures:
            lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: gate `{g['name']}` limit {g['limit']}, value {g['value']}")
        for b, e in errors:
            lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: {e}")
    lines += placement_markdown(report["builds"])
    lines += ["", "## Tool versions", ""]
    lines += [f"- {k} {v}" for k, v in report["versions"].items()]
    return "\n".join(lines) + "\n"


def _roofline(report: dict, worst: int = 3) -> list[str]:
    """Per build: the roofline bound against Vela's estimate, and the layers furthest from their own bound."""
    lines = ["", "## Roofline", "",
             "Bound: per Vela layer the larger of MACs at the MAC array's peak and the data bytes it moves over "
             "each memory (Vela's, less burst overhead) at that memory's peak bandwidth, summed; efficiency = bound / Vela's estimate.", ""]
    for b in report["builds"]:
        m = b["metrics"]
        roof = m.get("roofline")
        if not roof or m.get("bound_ms") is None:
            continue
        bound_by = ", ".join(f"{k} {v}" for k, v in roof["layers_bound_by"].items())
        gaps = "; ".join(f"{lay.get('onnx_node') or lay['tensor']} ({lay.get('npu_op')}) {lay['estimated_ms']:.4f} "
                         f"vs {lay['bound_ms']:.4f} ms, {lay['bound_by']}-bound"
                         for lay in roof["worst_layers"][:worst] if lay["gap_ms"] > 0)
        lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: bound {m['bound_ms']:.4f} ms of "
                     f"{_fmt(m.get('inference_ms'), 4)} ms estimated, efficiency {m['efficiency']:.2f} "
                     f"(MAC-bound {roof['mac_bound_ms']:.4f} ms, memory-bound {roof['memory_bound_ms']:.4f} ms; "
                     f"layers bound by {bound_by})" + (f"; furthest from their bound: {gaps}" if gaps else ""))
    return lines if len(lines) > 5 else []


def _gates_and_memory(report: dict) -> list[str]:
    """Per build: each gate with its limit and value, and each memory pool's use against its size."""
    lines = ["", "## Gates and memory", ""]
    for b in report["builds"]:
        gates = ", ".join(f"{g['name']} {_fmt(g['value'], 4)} (limit {g['limit']}{'' if g['ok'] else ', FAILED'})"
                          for g in b["gates"]) or "no gates"
        pools = ", ".join(f"{p['pool']} {p['used_kib']:.1f}/{p['size_kib']:.0f} KiB"
                          for p in b["metrics"].get("pools") or [])
        offload = b["metrics"].get("npu_offload")
        lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: {gates}"
                     + (f"; offload {offload:.0%}" if isinstance(offload, (int, float)) else "")
                     + (f"; {pools}" if pools else ""))
    return lines
