"""Compare a run's report.json with a baseline: per-metric deltas, regressions by YAML thresholds.

Thresholds say how much worse a metric may get before it counts as a
regression: `max_increase_pct` / `max_increase` for metrics where lower is
better (time, memory), `max_decrease` for ones where higher is better (SNR,
offload). They live in `regressions.yaml` at the project root (or a file
given with `--thresholds`); anything not set there keeps the defaults below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

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
    return {**DEFAULTS, **parsed.metrics}


@dataclass(frozen=True)
class Delta:
    build: str  # spec/model/target
    metric: str
    old: float | str | None
    new: float | str | None
    limit: str = ""
    regression: bool = False

    @property
    def change(self) -> str:
        if not (_is_number(self.old) and _is_number(self.new)):
            return "n/a"
        d = self.new - self.old
        pct = f" ({d / self.old * 100:+.2f}%)" if self.old else ""
        return f"{d:+.6g}{pct}"

    def line(self) -> str:
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
    missing_builds: list[str]
    unchanged: int  # builds whose shown metrics are all identical


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def compare(new: dict, old: dict, thresholds: dict[str, Threshold]) -> Comparison:
    old_by = {build_id(b): b for b in old.get("builds", [])}
    new_by = {build_id(b): b for b in new.get("builds", [])}
    deltas: list[Delta] = []
    regressions: list[Delta] = []
    unchanged = 0
    for bid, b in new_by.items():
        ob = old_by.get(bid)
        if ob is None:
            continue
        if ob.get("status") == "passed" and b.get("status") != "passed":
            regressions.append(Delta(bid, "status", ob["status"], b.get("status"), "", True))
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
        unchanged += not changed
    ov, nv = old.get("versions", {}), new.get("versions", {})
    versions = {k: (ov.get(k, "-"), nv.get(k, "-")) for k in sorted(set(ov) | set(nv)) if ov.get(k) != nv.get(k)}
    return Comparison(deltas, regressions, versions, sorted(set(new_by) - set(old_by)),
                      sorted(set(old_by) - set(new_by)), unchanged)


def render_comparison(c: Comparison, baseline: str) -> str:
    """Markdown section: regressions, deltas, tool version changes next to them."""
    lines = ["## Against the baseline", "", f"Baseline: `{baseline}`", ""]
    if c.version_changes:
        lines.append("Tool versions changed: " + ", ".join(
            f"{k} {a} -> {b}" for k, (a, b) in c.version_changes.items()))
        lines.append("")
    if c.regressions:
        lines += [f"**{len(c.regressions)} regression(s):**", ""]
        for r in c.regressions:
            lines.append(f"- {r.line()}")
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
    if c.new_builds:
        lines.append(f"New builds (no baseline): {', '.join(c.new_builds)}")
    if c.missing_builds:
        lines.append(f"Builds in the baseline but not in this run: {', '.join(c.missing_builds)}")
    return "\n".join(lines) + "\n"
