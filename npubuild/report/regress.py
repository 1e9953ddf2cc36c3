"""Compare a run's report.json with a baseline: per-metric deltas, regressions by YAML thresholds.

Thresholds say how much worse a metric may get before it counts as a
regression: `max_increase_pct` / `max_increase` for metrics where lower is
better (time, memory), `max_decrease` for ones where higher is better (SNR,
offload). They live in `regressions.yaml` at the project root (or a file
given with `--thresholds`); anything not set there keeps the defaults below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from npubuild.config.selection import Selection

THRESHOLDS_FILE = "regressions.yaml"


class Threshold(BaseModel):
    """How much a metric may worsen; unset bounds are not checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_increase_pct: float | None = Field(None, ge=0, description="Allowed rise, percent of the old value")
    max_increase: float | None = Field(None, ge=0, description="Allowed rise, in the metric's unit")
    max_decrease: float | None = Field(None, ge=0, description="Allowed fall, in the metric's unit")


class Thresholds(BaseModel):
    """regressions.yaml: `version: 1` and `metrics: {name: Threshold}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(1, ge=1, le=1)
    metrics: dict[str, Threshold] = Field(default_factory=dict)


DEFAULTS: dict[str, Threshold] = {
    "inference_ms": Threshold(max_increase_pct=2.0),
    "npu_cycles": Threshold(max_increase_pct=2.0),
    "sram_kib": Threshold(max_increase=0.0),
    "offchip_kib": Threshold(max_increase=0.0),
    "cpu_ops": Threshold(max_increase=0.0),
    "npu_offload": Threshold(max_decrease=0.0),
    "tosa_max_error_lsb": Threshold(max_increase=0.0),
    "tosa_snr_db": Threshold(max_decrease=0.5),
    "quant_snr_db": Threshold(max_decrease=0.5),
}
# Which way is better, for metrics no gate names a direction for (config/metrics.GATES does for the rest);
# None: neither (more MACs is a different model, not a worse one).
DIRECTIONS: dict[str, str | None] = {"npu_ops": "higher", "macs": None, "efficiency": "higher",
                                     "tosa_mean_error_lsb": "lower", "tosa_cosine": "higher", "bound_ms": "lower"}


def better_direction(metric: str) -> str | None:
    """'lower' or 'higher' is better for `metric`, or None: from the gate that checks it (a `max_` gate: lower;
    `min_`: higher), else DIRECTIONS, else by the unit in its name (a `_db` is higher-better, time, memory,
    cycles and errors lower-better)."""
    from npubuild.config.metrics import GATES

    for g in GATES:
        if g.metric == metric and g.compare != "eq":
            return "lower" if g.compare == "max" else "higher"
    if metric in DIRECTIONS:
        return DIRECTIONS[metric]
    if metric.endswith(("_db", "_agreement", "accuracy")):
        return "higher"
    if metric.endswith(("_ms", "_kib", "_cycles", "_lsb", "_ops")):
        return "lower"
    return None


# Metrics shown in the delta table even without a threshold.
SHOWN = ("inference_ms", "npu_cycles", "sram_kib", "offchip_kib", "npu_ops", "cpu_ops", "npu_offload", "macs",
         "tosa_max_error_lsb", "tosa_snr_db", "quant_snr_db")


def load_thresholds(path: Path | None, project_root: Path) -> dict[str, Threshold]:
    """Defaults overlaid with the YAML file (explicit path, else <project>/regressions.yaml if present)."""
    from npubuild.config.load import validate
    from npubuild.config.yamlfile import load_yaml

    if path is None:
        candidate = project_root / THRESHOLDS_FILE
        if not candidate.is_file():
            return dict(DEFAULTS)
        path = candidate
    data, marks = load_yaml(path)
    parsed = validate(Thresholds, data if data is not None else {}, marks, path)
    check_metric_names(parsed, marks, path)
    return {**DEFAULTS, **parsed.metrics}


def check_metric_names(parsed: Thresholds, marks, path: Path) -> None:
    """A threshold for a metric report.json does not have would never be checked: a typo (`acuracy:`) is an
    error at its position, with the closest metric name, not a silently ignored line."""
    from npubuild.config.metrics import METRICS
    from npubuild.config.yamlfile import KEY, locate
    from npubuild.errors import InputError, Location
    from npubuild.suggest import did_you_mean

    known = [m.name for m in METRICS]
    for name in parsed.metrics:
        if name not in known:
            where = marks.get(("metrics", name, KEY)) or locate(marks, ("metrics", name), Location(str(path), 1, 1))
            hint = did_you_mean(name, known) or " (`npubuild report` compares the metrics of report.json)"
            raise InputError(f"metrics: unknown metric '{name}'{hint}", where)


@dataclass(frozen=True)
class Delta:
    build: str  # spec/model/target
    metric: str  # a metric, or `status` (a build that passed and now does not, or vanished)
    old: float | str | None
    new: float | str | None
    limit: str = ""
    regression: bool = False
    cause: str = ""  # for `status`: why the build failed now, or that it is not in this run

    @property
    def change(self) -> str:
        if not (_is_number(self.old) and _is_number(self.new)):
            return self.cause or "n/a"
        d = self.new - self.old
        pct = f" ({d / self.old * 100:+.2f}%)" if self.old else ""
        return f"{d:+.6g}{pct}"

    def line(self) -> str:
        if self.metric == "status":
            return f"{self.build}: status {_num(self.old)} -> {_num(self.new)}: {self.cause or 'no cause recorded'}"
        return f"{self.build}: {self.metric} {_num(self.old)} -> {_num(self.new)} {self.change}" + (
            f", allowed {self.limit}" if self.limit else "")


def _num(v) -> str:
    return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def _limit_text(t: Threshold) -> str:
    parts = []
    if t.max_increase_pct is not None:
        parts.append(f"+{t.max_increase_pct:g}%")
    if t.max_increase is not None:
        parts.append(f"+{t.max_increase:g}")
    if t.max_decrease is not None:
        parts.append(f"-{t.max_decrease:g}")
    return " / ".join(parts)


def worse(t: Threshold, old: float, new: float) -> bool:
    """True if `new` is worse than `old` by more than the threshold allows."""
    eps = 1e-9
    if t.max_increase_pct is not None and new > old * (1 + t.max_increase_pct / 100) + eps:
        return True
    if t.max_increase is not None and new > old + t.max_increase + eps:
        return True
    return t.max_decrease is not None and new < old - t.max_decrease - eps


def build_id(b: dict) -> str:
    return f"{b['spec']}/{b['model']}/{b['target']}"


@dataclass
class Comparison:
    deltas: list[Delta]  # changed metrics only
    regressions: list[Delta]
    version_changes: dict[str, tuple[str, str]]
    new_builds: list[str]
    missing_builds: list[str]  # in the baseline, not in this run, and asked for: regressions
    unchanged: int  # builds that passed in both runs with every shown metric identical
    not_asked: list[str] = field(default_factory=list)  # in the baseline, left out by this run's selection
    failed: list[str] = field(default_factory=list)  # builds of this run that did not pass
    changes: dict[str, list[str]] = field(default_factory=dict)  # build -> what it is made from that changed
    commit_change: tuple[str | None, str | None] | None = None  # the project's commit, if it differs

    def what_changed(self, build: str) -> list[str]:
        """Why a build may have changed: its inputs, the tools, the project's commit."""
        out = list(self.changes.get(build, []))
        out += [f"{k} {a} -> {b}" for k, (a, b) in self.version_changes.items()]
        if self.commit_change:
            out.append(f"commit {self.commit_change[0] or '?'} -> {self.commit_change[1] or '?'}")
        return out


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


INPUT_NAMES = {"model_sha256": "model file", "spec": "compile spec", "target": "target profile",
               "pipeline": "pipeline"}


def asked_for(build: str, selection: dict | None) -> bool:
    """Whether a run asked for `build` (spec/model/target), by report.json's `selection`
    (config/selection.py). A report without a selection (an older one) asked for everything."""
    return not selection or Selection.from_json(selection).asked_for(build)


def _input_changes(old: dict, new: dict) -> list[str]:
    oi, ni = old.get("inputs") or {}, new.get("inputs") or {}
    return [f"{label} changed" for k, label in INPUT_NAMES.items() if k in oi and k in ni and oi[k] != ni[k]]


def compare(new: dict, old: dict, thresholds: dict[str, Threshold]) -> Comparison:
    from npubuild.report.brief import failure_cause
    from npubuild.report.status import passed, worse_status

    old_by = {build_id(b): b for b in old.get("builds", [])}
    new_by = {build_id(b): b for b in new.get("builds", [])}
    deltas: list[Delta] = []
    regressions: list[Delta] = []
    changes: dict[str, list[str]] = {}
    unchanged = 0
    failed = [bid for bid, b in new_by.items() if not passed(b.get("status"))]
    for bid, b in new_by.items():
        ob = old_by.get(bid)
        if ob is None:
            continue
        inputs = _input_changes(ob, b)
        if inputs:
            changes[bid] = inputs
        if worse_status(ob.get("status"), b.get("status")):  # failed, or the host took over the NPU's work
            regressions.append(Delta(bid, "status", ob["status"], b.get("status"), "", True,
                                     failure_cause(b) or "; ".join(b.get("warnings") or [])))
        changed = False
        for metric in dict.fromkeys((*SHOWN, *thresholds)):
            ov, nv = ob.get("metrics", {}).get(metric), b.get("metrics", {}).get(metric)
            if not (_is_number(ov) and _is_number(nv)) or ov == nv:
                continue
            changed = True
            t = thresholds.get(metric)
            bad = t is not None and worse(t, ov, nv)
            d = Delta(bid, metric, ov, nv, _limit_text(t) if t else "", bad)
            deltas.append(d)
            if bad:
                regressions.append(d)
        unchanged += not changed and passed(b.get("status")) and b.get("status") == ob.get("status")
    gone = sorted(set(old_by) - set(new_by))
    missing = [bid for bid in gone if asked_for(bid, new.get("selection"))]
    for bid in missing:
        regressions.append(Delta(bid, "status", old_by[bid].get("status"), "missing", "", True,
                                 "not in this run (it was not built: a spec, model or target removed, or the "
                                 "run stopped before it)"))
    ov, nv = old.get("versions", {}), new.get("versions", {})
    versions = {k: (ov.get(k, "-"), nv.get(k, "-")) for k in sorted(set(ov) | set(nv)) if ov.get(k) != nv.get(k)}
    commits = (old.get("commit"), new.get("commit"))
    return Comparison(deltas, regressions, versions, sorted(set(new_by) - set(old_by)), missing, unchanged,
                      [bid for bid in gone if bid not in missing], failed, changes,
                      commits if commits[0] != commits[1] and any(commits) else None)


def render_comparison(c: Comparison, baseline: str) -> str:
    """Markdown section: regressions, deltas, tool version changes next to them."""
    lines = ["## Against the baseline", "", f"Baseline: `{baseline}`", ""]
    if c.version_changes:
        lines.append("Tool versions changed: " + ", ".join(
            f"{k} {a} -> {b}" for k, (a, b) in c.version_changes.items()))
        lines.append("")
    if c.commit_change:
        lines += [f"Commit: {c.commit_change[0] or '?'} -> {c.commit_change[1] or '?'}", ""]
    if c.regressions:
        lines += [f"**{len(c.regressions)} regression(s):**", ""]
        for r in c.regressions:
            changed = c.changes.get(r.build)
            lines.append(f"- {r.line()}" + (f" ({', '.join(changed)})" if changed else ""))
        lines.append("")
    else:
        lines += ["No regression.", ""]
    if c.deltas:
        lines += ["| build | metric | old | new | change | allowed | regression |", "|---|---|---:|---:|---:|---|---|"]
        for d in c.deltas:
            lines.append(f"| {d.build} | {d.metric} | {_num(d.old)} | {_num(d.new)} | {d.change} | {d.limit or '-'} | "
                         f"{'**yes**' if d.regression else 'no'} |")
        lines.append("")
    lines.append(f"{c.unchanged} build(s) with unchanged metrics.")
    if c.failed:
        lines.append(f"{len(c.failed)} build(s) did not pass: {', '.join(c.failed)}")
    if c.new_builds:
        lines.append(f"New builds (no baseline): {', '.join(c.new_builds)}")
    if c.missing_builds:
        lines.append(f"Builds in the baseline but not in this run (regressions): {', '.join(c.missing_builds)}")
    if c.not_asked:
        lines.append(f"Baseline builds this run did not ask for (--only or spec selection): {len(c.not_asked)}")
    return "\n".join(lines) + "\n"
