"""report.json / report.md for a whole run: one entry per spec x model x target.

Built after the task graph ran, from the stage records on disk, so it is the
same whichever executor ran the stages; `cached` is true for a stage whose
record comes from an earlier run.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from npubuild.config.accelerator import Accelerator
from npubuild.config.load import Build
from npubuild.config.metrics import GATE_BY_KEY
from npubuild.engine.execute import read_error
from npubuild.engine.plan import BuildPlan
from npubuild.engine.session import RunOutcome
from npubuild.engine.uptodate import INPUTS_NAME, read_json_cached, read_record
from npubuild.engine.versions import all_versions
from npubuild.fileio import _json_default, stable_hash, write_text
from npubuild.records.build import BuildEntry, Outcome, StageEntry, StageRecord, Status
from npubuild.records.lower import LowerRecord
from npubuild.records.vela import VelaRecord
from npubuild.report.brief import failure_cause, gate_text, num, pools_text
from npubuild.report.html import write_html
from npubuild.report.metrics import build_metrics
from npubuild.report.numerics import numerics_markdown, stored_layers
from npubuild.report.offloads import placement_markdown
from npubuild.report.precision import precision_markdown
from npubuild.report.status import placement_status


def build_entries(plan: BuildPlan, run_id: str, run: RunOutcome | None = None) -> list[dict]:
    """One entry per build. `run`: what became of each task in this run; a stage whose task it did not run,
    restore or check up to date is not built in this report (`not_run`, the build skipped), whatever record an
    earlier run left: that record's inputs were not checked, so its figures may not be the build's now. None:
    every record on disk is taken as current (a report made outside a run)."""
    entries = []
    for b in plan.builds:
        chain = plan.build_tasks[b.id]
        stages: dict[str, StageEntry] = {}
        errors: list[str] = []
        error_kinds: set[str] = set()
        entry_metrics: dict = {}
        gates: list[dict] = []
        warnings: list[str] = []
        records: dict[str, dict] = {}
        failed_pools: list[dict] | None = None  # a pool check that failed: what each pool needs and has
        for stage, name in chain.items():
            task = plan.tasks[name]
            outcome = run.outcome(name) if run is not None else None
            rec = read_record(task) if outcome is None or outcome.current else None
            if rec is not None:
                records[stage] = rec
                stages[stage] = StageEntry.of(StageRecord.from_json(rec), run_id)
                if stage == "report":
                    entry_metrics, gates = rec["metrics"]["metrics"], rec["metrics"]["gates"]
                    warnings = list(rec["metrics"].get("warnings") or [])
                continue
            err = read_error(task) if outcome in (None, Outcome.FAILED) else None
            if run is not None and err is not None and err.get("run_id") != run_id:
                err = None  # an earlier run's error: this run failed before the stage started (an input unreadable)
            if outcome == Outcome.FAILED and err is None:
                err = {"kind": "stage", "message": run.messages.get(name) or "failed"}
            if err is not None:
                stages[stage] = StageEntry(Status.FAILED, error=err["message"])
                errors.append(err["message"])
                error_kinds.add(err.get("kind", "stage"))
                failed_pools = failed_pools or failure_pools(err, b.target.name)
            elif run is None:  # not run: an upstream task failed, or the run stopped before it
                stages[stage] = StageEntry(Status.SKIPPED)
            else:
                stages[stage] = StageEntry(Status.SKIPPED, not_run=not_run_reason(plan, run, name))
        if "report" not in records and any(s != "report" for s in records):
            entry_metrics = known_metrics(plan, b, records)  # a stage failed: what the finished ones measured
        if failed_pools is not None:
            entry_metrics = {**entry_metrics, "pools": failed_pools}
        for stage, reason in plan.skipped.get(b.id, {}).items():  # decided when the plan was made
            stages[stage] = StageEntry(Status.SKIPPED, reason=reason)
        if errors:
            status = Status.FAILED
        elif any(s.status == Status.SKIPPED and s.reason is None for k, s in stages.items() if k != "fvp"):
            status = Status.SKIPPED  # a stage that should have run did not (the FVP's absence never makes it so)
        elif any(not g["ok"] for g in gates):
            status = Status.FAILED
        else:
            status = placement_status(entry_metrics)  # passed: on the NPU, mostly on the host, or only there
        entry = BuildEntry(b.spec.name, b.model_name, b.target.name, b.target.accelerator, status, stages,
                           entry_metrics, tuple(gates), tuple(errors), tuple(sorted(error_kinds)),
                           artifacts(plan, b.id, records),
                           {"clock_mhz": b.target.clock_mhz, "inputs": build_inputs(plan, b, "import" in records),
                            **({} if "report" in records else {"unchecked_gates": unchecked_gates(b)}),
                            **stored_layers(plan.build_dir, b.id, records.get("lower", {}).get("cache_key"))},
                           tuple(warnings))
        entries.append(entry.to_json())
    return entries


def not_run_reason(plan: BuildPlan, run: RunOutcome, name: str) -> str:
    """Why a task did not run in this run: the upstream task that failed (blocked), else why the run stopped."""
    if run.outcome(name) == Outcome.BLOCKED:
        seen: set[str] = set()
        stack = list(plan.tasks[name].deps)
        while stack:
            dep = stack.pop(0)
            if dep in seen:
                continue
            seen.add(dep)
            if run.outcome(dep) == Outcome.FAILED:
                return f"its upstream task {dep} failed"
            stack.extend(plan.tasks[dep].deps)
        return "an upstream task failed"
    return run.stopped or "the run ended before it"


def failure_pools(err: dict, target: str) -> list[dict] | None:
    """The pools of a failed pool check (errors.PoolsTooSmall's detail in error.json) for `target`: each with
    its need and size, `lower_bound` set when the need is the early check's bound from the model's shapes."""
    pools = (err.get("pools") or {}).get(target) if isinstance(err.get("pools"), dict) else None
    if not isinstance(pools, list):
        return None
    bound = bool(err.get("lower_bound"))
    return [{**p, "lower_bound": bound} for p in pools if isinstance(p, dict)]


def unchecked_gates(b: Build) -> list[dict]:
    """The gates of a build whose report stage did not run (it failed earlier or was not built): kept so
    that JUnit and the HTML still list them, as not evaluated, and a failing night has as many testcases."""
    return [{"name": k, "metric": GATE_BY_KEY[k].metric, "limit": v}
            for k, v in b.expect.items() if k in GATE_BY_KEY]


def build_inputs(plan: BuildPlan, b: Build, imported: bool = True) -> dict[str, str | None]:
    """Fingerprints of what a build is made from, so a comparison can say what changed: the model file's
    sha256 (from the import stage's inputs.json, when the import is current in this run: `imported`), the
    resolved spec, target profile and pipeline."""
    model = None
    task = plan.tasks[plan.build_tasks[b.id]["import"]]
    try:
        model = read_json_cached(task.dir / INPUTS_NAME)["inputs"]["model"][2] if imported else None
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        pass
    spec = b.spec.model_dump(exclude={"targets", "description"})
    return {"model_sha256": model, "spec": stable_hash(spec), "target": stable_hash(b.target.model_dump()),
            "pipeline": stable_hash(b.pipeline.model_dump())}


def project_commit(root: Path) -> str | None:
    """The project's git commit (with `-dirty` if it has uncommitted changes to tracked files), or None."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "diff", "--quiet", "HEAD", "--"], capture_output=True,
                               timeout=30).returncode == 1
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip()[:12] + ("-dirty" if dirty else "")


def known_metrics(plan: BuildPlan, b: Build, records: dict[str, dict]) -> dict:
    """The report's metrics of a build whose report stage did not run (a stage failed), from the records of
    the stages that finished (None for the rest); when Vela did not finish, the placement (offloads,
    partitions, host nodes) from the lower stage's io.json, so a nightly's failed build still shows it."""
    records = {s: r for s, r in records.items() if s != "report"}
    if "vela" not in records and "lower" in records and "vela" in plan.build_tasks[b.id]:
        io_path = plan.tasks[plan.build_tasks[b.id]["lower"]].outputs["io"]
        try:
            io = LowerRecord.read(io_path)
        except (OSError, ValueError, KeyError):
            io = None
        placed = io.families.get(Accelerator.parse(b.target.accelerator).lowering_family) if io else None
        if io is not None:
            records["vela"] = {"metrics": {"accelerator": b.target.accelerator,
                                           **(placed.placement_metrics() if placed is not None else {})}}
    return build_metrics(records, b.target.accelerator)


def artifacts(plan: BuildPlan, build_id: str, records: dict[str, dict] | None = None) -> dict[str, str]:
    """Paths of the build's main outputs; the Vela files from its stage record (no directory scan per build):
    the TOSA graph, the Vela model, vela.log, Vela's per-layer CSV and the firmware C files."""
    chain = plan.build_tasks[build_id]
    out = {}
    # the float model as imported, the quantised (QDQ) model the integer graph implements, and io.json (how
    # to feed and read the graphs): what a user or a bench needs to run the build's models side by side
    for key, stage, output in (("float", "import", "onnx"), ("qdq", "quantize", "onnx"), ("io", "lower", "io")):
        if stage in chain:
            out[key] = str(plan.tasks[chain[stage]].outputs[output])
    lower_dir = plan.tasks[chain["lower"]].dir
    # a model with nodes no lowering takes has no model.tosa: it runs as partitions (io.json's `portable`)
    if (lower_dir / "model.tosa").is_file() or not (lower_dir / "io.json").is_file():
        out["tosa"] = str(lower_dir / "model.tosa")
    vela = plan.tasks[chain["vela"]] if "vela" in chain else None
    if vela is None:
        return out
    vela_rec = (records or {}).get("vela")
    try:  # a failed vela stage (a pool too small) still wrote its summary: its model is linked, nothing else
        rec = VelaRecord.from_json(vela_rec["metrics"]) if vela_rec else VelaRecord.read(vela.outputs["summary"])
    except (OSError, ValueError, KeyError, TypeError):
        return out
    parts = rec.partitions
    models = sorted(f for p in parts for f in (p.tflite, p.npz) if f in rec.artifacts)  # the format asked for
    if models:
        out["vela"] = str(vela.dir / models[-1])
    if not vela_rec:
        return out
    if len(parts) == 1:  # a split graph has one log per NPU partition and no single log to link
        out["vela_log"] = str(vela.dir / parts[0].log)
    csv = sorted(p.per_layer_csv for p in parts if p.per_layer_csv)
    if csv:
        out["per_layer_csv"] = str(vela.dir / csv[0])
    firmware = parts[0].firmware if parts else None
    if firmware is not None:
        out["firmware_c"] = str(vela.dir / firmware.source)
        out["firmware_h"] = str(vela.dir / firmware.header)
    if rec.deployment is not None:
        out["deployment"] = str(vela.dir / rec.deployment)
    return out


def make_report(plan: BuildPlan, run_id: str, selection: dict | None = None, run: RunOutcome | None = None) -> dict:
    """report.json's content: the run (id, time, what was asked for, the project's commit), tool versions and
    one entry per build (`run`: see build_entries)."""
    roots = sorted({b.project_root for b in plan.builds})
    return {"run_id": run_id, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "selection": selection, "commit": project_commit(roots[0]) if roots else None,
            "versions": all_versions(), "builds": build_entries(plan, run_id, run)}


def write_reports(report: dict, out_dir: Path, plot_cache: Path | None = None) -> None:
    """report.json, report.md and report.html into `out_dir`; the HTML's change column against the report this
    one replaces (the previous run in this build dir), when it can be read."""
    previous = previous_report(out_dir / "report.json")
    # compact: json's C encoder only runs without indent, and report.json of a nightly matrix is megabytes
    write_text(out_dir / "report.json", json.dumps(report, default=_json_default) + "\n")
    write_text(out_dir / "report.md", render_markdown(report))
    write_html(out_dir / "report.html", report, cache_dir=plot_cache, previous=previous)


def previous_report(path: Path) -> dict | None:
    """The report.json a run is about to replace, if it is a well-formed report (else None: nothing to say)."""
    from npubuild.errors import InputError
    from npubuild.report.reportfile import load_report

    try:
        return load_report(path) if path.is_file() else None
    except (InputError, OSError):
        return None


def render_markdown(report: dict) -> str:
    from npubuild.report.html import ordered

    builds = ordered(report["builds"])
    lines = ["# npubuild report", "",
             "| spec | model | target | status | NPU ops | CPU ops | SRAM KiB | off-chip KiB | inference ms | "
             "inferences/s | NPU cycles | TOSA max LSB | TOSA SNR dB | quant SNR dB | cached stages | problem |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for b in builds:
        m = b["metrics"]
        cached = sum(1 for s in b["stages"].values() if s.get("cached"))
        ran = sum(1 for s in b["stages"].values() if s["status"] == "passed")
        ms = m.get("inference_ms")
        rate = f"{1000 / ms:.0f}" if isinstance(ms, (int, float)) and ms > 0 else "-"
        cause = (failure_cause(b) or "-").replace("|", "/")
        lines.append(
            f"| {b['spec']} | {b['model']} | {b['target']} | {b['status']} | {num(m.get('npu_ops'))} | "
            f"{num(m.get('cpu_ops'))} | {num(m.get('sram_kib'))} | {num(m.get('offchip_kib'))} | "
            f"{num(ms)} | {rate} | {num(m.get('npu_cycles'))} | {num(m.get('tosa_max_error_lsb'))} | "
            f"{num(m.get('tosa_snr_db'), 3)} | {num(m.get('quant_snr_db'), 3)} | {cached}/{ran} | {cause} |")
    lines += _gates_and_memory({**report, "builds": builds})
    lines += _roofline(builds)
    lines += numerics_markdown(builds)
    lines += precision_markdown(builds)
    failures = [(b, g) for b in builds for g in b["gates"] if not g["ok"]]
    errors = [(b, e) for b in builds for e in b["errors"]]
    warned = [(b, w) for b in builds for w in b.get("warnings") or []]
    if warned:
        lines += ["", "## Warnings", ""]
        lines += [f"- {b['spec']}/{b['model']}/{b['target']}: {w}" for b, w in warned]
    if failures or errors:
        lines += ["", "## Problems", ""]
        for b, g in failures:
            lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: {gate_text(g)}")
        for b, e in errors:
            lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: {e}")
    lines += placement_markdown(builds)
    lines += ["", "## Tool versions", ""]
    lines += [f"- {k} {v}" for k, v in report["versions"].items()]
    return "\n".join(lines) + "\n"


def _roofline(builds: list[dict], worst: int = 3) -> list[str]:
    """Per build: the roofline bound against Vela's estimate, and the layers furthest from their own bound."""
    lines = ["", "## Roofline", "",
             "Bound: per Vela layer the larger of MACs at the MAC array's peak and the data bytes it moves over "
             "each memory (Vela's, less burst overhead) at that memory's peak bandwidth, summed; efficiency = "
             "bound / Vela's estimate.", ""]
    for b in builds:
        m = b["metrics"]
        roof = m.get("roofline")
        if not roof or m.get("bound_ms") is None:
            continue
        bound_by = ", ".join(f"{k} {v}" for k, v in roof["layers_bound_by"].items())
        gaps = "; ".join(f"{lay.get('onnx_node') or lay['tensor']} ({lay.get('npu_op')}) {lay['estimated_ms']:.4f} "
                         f"vs {lay['bound_ms']:.4f} ms, {lay['bound_by']}-bound"
                         for lay in roof["worst_layers"][:worst] if lay["gap_ms"] > 0)
        lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: bound {m['bound_ms']:.4f} ms of "
                     f"{num(m.get('inference_ms'))} ms estimated, efficiency {m['efficiency']:.2f} "
                     f"(MAC-bound {roof['mac_bound_ms']:.4f} ms, memory-bound {roof['memory_bound_ms']:.4f} ms; "
                     f"layers bound by {bound_by})" + (f"; furthest from their bound: {gaps}" if gaps else ""))
    return lines if len(lines) > 5 else []


def _gates_and_memory(report: dict) -> list[str]:
    """Per build: each gate with its limit and value, and each memory pool's use against its size."""
    lines = ["", "## Gates and memory", ""]
    for b in report["builds"]:
        gates = ", ".join(f"{g['name']} {num(g['value'])} (limit {g['limit']}{'' if g['ok'] else ', FAILED'})"
                          for g in b["gates"]) or "no gates"
        unchecked = [g["name"] for g in b.get("unchecked_gates", [])]
        if unchecked:
            gates = f"not evaluated: {', '.join(unchecked)}"
        pools = pools_text(b["metrics"])
        offload = b["metrics"].get("npu_offload")
        lines.append(f"- {b['spec']}/{b['model']}/{b['target']}: {gates}"
                     + (f"; offload {offload:.0%}" if isinstance(offload, (int, float)) else "")
                     + (f"; {pools}" if pools else ""))
    return lines
