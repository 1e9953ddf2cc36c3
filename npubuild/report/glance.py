"""A build at a glance: does it fit, how fast, how accurate, what changed, in a few words each.

The HTML report's Builds table is made of these (one short cell per question, so every build's answers
fit a laptop screen's width); the details behind them are in the per-build panel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from npubuild.report.brief import num
from npubuild.report.regress import Comparison, Delta, better_direction

# Accuracy against the float model, most telling first: the deployed graph's SNR and agreement against float
# on held-back samples (issue 30's `float_*` metrics), then the QDQ model's SNR against float on the TOSA
# check's samples (`quant_snr_db`). The first present is shown; the others are in the build's panel.
VS_FLOAT_SNR = ("float_snr_db", "quant_snr_db")
VS_FLOAT_AGREEMENT = (("float_top1_agreement", "top-1"), ("float_mask_iou", "IoU"),
                      ("float_decision_agreement", "agree"))
# SNR against float below this is marked: the int8 model may have collapsed (issue 30's bar is 20 dB)
LOW_SNR_DB = 20.0
# the few metrics the change column names, in this order; the full list is in the baseline section
CHANGE_METRICS = ("inference_ms", "sram_kib", "offchip_kib", "npu_offload", *VS_FLOAT_SNR, "tosa_snr_db",
                  "tosa_max_error_lsb", "accuracy", "npu_cycles", "macs")
SHORT = {"inference_ms": "ms", "sram_kib": "SRAM", "offchip_kib": "off-chip", "npu_offload": "NPU",
         "quant_snr_db": "QDQ SNR", "float_snr_db": "float SNR",
         "tosa_snr_db": "TOSA SNR", "tosa_max_error_lsb": "LSB", "accuracy": "top-1", "npu_cycles": "cycles",
         "macs": "MACs"}


@dataclass(frozen=True)
class Fit:
    """The fullest pool of a build: the fraction of it used (> 1: does not fit), as text."""

    pool: str
    used_kib: float
    size_kib: float
    fits: bool
    lower_bound: bool  # the need is the early check's bound from the model's shapes (it needs at least that)

    @property
    def fraction(self) -> float:
        return self.used_kib / self.size_kib

    @property
    def headroom_kib(self) -> float:
        return self.size_kib - self.used_kib

    def text(self) -> str:
        """`sram 56% \u00b7 72.0/128 KiB`; a pool that does not fit: `sram needs 219/128 KiB`."""
        if self.fits:
            return f"{self.pool} {self.fraction:.0%} \u00b7 {kib(self.used_kib)}/{kib(self.size_kib)} KiB"
        need = ("\u2265 " if self.lower_bound else "") + kib(self.used_kib)
        return f"{self.pool} needs {need}/{kib(self.size_kib)} KiB"


def kib(v: float) -> str:
    """`72.5`, `385`, `2048`: KiB with the digits a glance needs."""
    return f"{v:.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.1f}"


def milliseconds(ms: float) -> str:
    """`0.488`, `5.00`, `12.5`, `130`: three significant digits, not fewer decimals for a large figure."""
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 1 else f"{ms:.3g}"


def fullest_pool(m: dict) -> Fit | None:
    """The pool with the largest share used (the one that does not fit, if any); None where Vela never sized
    the pools (a build that failed before it)."""
    pools = [p for p in m.get("pools") or [] if p.get("size_kib")]
    if not pools:
        return None
    p = max(pools, key=lambda p: (not p.get("fits", True), p["used_kib"] / p["size_kib"]))
    return Fit(str(p["pool"]), float(p["used_kib"]), float(p["size_kib"]), bool(p.get("fits", True)),
               bool(p.get("lower_bound")))


def speed_text(m: dict) -> str:
    """`0.272 ms \u00b7 3,678/s`, '-' where not measured."""
    ms = m.get("inference_ms")
    if not isinstance(ms, (int, float)) or ms <= 0:
        return "-"
    return f"{milliseconds(ms)} ms \u00b7 {1000 / ms:,.0f}/s"


_LOCATION = re.compile(r"^([\w-]+: )\S+?\.(?:onnx|ya?ml|npy|npz|json|tosa)(?::\d+(?::\d+)?)?: ")


def short_cause(cause: str | None) -> str:
    """A failure cause without the file it names (`import: /a/b/m.onnx: node ...` -> `import: node ...`): the
    table cell's text, the whole cause in its tooltip and the build's panel."""
    return _LOCATION.sub(r"\1", cause or "")


def _first(m: dict, names: tuple[str, ...]) -> tuple[str | None, float | None]:
    for n in names:
        v = m.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return n, float(v)
    return None, None


@dataclass(frozen=True)
class Accuracy:
    """Against float (what a user's task sees) and the integer graph against the QDQ model (the lowering)."""

    vs_float: str  # `9.3 dB`, with agreement or top-1 where measured; '-' where nothing was
    vs_float_db: float | None
    low: bool  # below LOW_SNR_DB against float
    vs_qdq: str  # `26.5 dB, 19 LSB`
    vs_qdq_db: float | None


def accuracy(m: dict) -> Accuracy:
    name, snr = _first(m, VS_FLOAT_SNR)
    parts = [f"{snr:.1f} dB"] if snr is not None else []
    found, agree = _first(m, tuple(n for n, _ in VS_FLOAT_AGREEMENT))
    if agree is not None:
        parts.append(f"{dict(VS_FLOAT_AGREEMENT)[found]} {agree:.0%}")
    collapsed = m.get("collapsed_outputs")
    acc = m.get("accuracy")
    if isinstance(acc, (int, float)):
        parts.append(f"{acc:.1%}")  # int8 top-1 (float -> int8 in the build's panel)
    tosa, lsb = m.get("tosa_snr_db"), m.get("tosa_max_error_lsb")
    qdq = [f"{tosa:.1f} dB"] if isinstance(tosa, (int, float)) else []
    if isinstance(lsb, (int, float)):
        qdq.append(f"{lsb:.0f} LSB")
    low = (snr is not None and snr < LOW_SNR_DB) or (isinstance(collapsed, int) and collapsed > 0)
    return Accuracy(" \u00b7 ".join(parts) or "-", snr, low, ", ".join(qdq) or "-",
                    float(tosa) if isinstance(tosa, (int, float)) else None)


@dataclass(frozen=True)
class Change:
    """What moved for one build against the baseline (or the previous run): a few words, and whether any of
    it is worse (by the metric's direction) or a regression past its threshold."""

    text: str
    worse: bool
    better: bool
    regression: bool
    full: str = ""  # every metric that moved, for the cell's tooltip


def _delta_words(d: Delta) -> str:
    label = SHORT.get(d.metric, d.metric)
    old, new = d.old, d.new
    assert isinstance(old, (int, float)) and isinstance(new, (int, float))
    if d.metric.endswith("_db"):
        return f"{label} {new - old:+.1f} dB"
    if d.metric == "npu_offload":
        return f"{label} {(new - old) * 100:+.0f} pt"
    if old:
        return f"{label} {(new - old) / abs(old) * 100:+.1f}%"
    return f"{label} {num(old)}\u2192{num(new)}"


def change(build: str, comparison: Comparison | None, shown: int = 2) -> Change:
    """The change column: `new`, `=` (nothing moved), the status change, or the few metrics that moved most
    telling first (regressions, then CHANGE_METRICS order)."""
    if comparison is None:
        return Change("", False, False, False)
    if build in comparison.new_builds:
        return Change("new", False, False, False)
    status = [r for r in comparison.regressions if r.build == build and r.metric == "status"]
    if status:
        return Change(f"{status[0].old} \u2192 {status[0].new}", True, False, True, status[0].line())
    mine = [d for d in comparison.deltas if d.build == build]
    if not mine:
        return Change("=", False, False, False)
    order = {m: i for i, m in enumerate(CHANGE_METRICS)}
    mine.sort(key=lambda d: (not d.regression, order.get(d.metric, len(order))))
    worse = [d for d in mine if _is_worse(d)]
    better = [d for d in mine if _is_better(d)]
    words = [_delta_words(d) for d in mine[:shown]] + ([f"+{len(mine) - shown} more"] if len(mine) > shown else [])
    full = "; ".join(f"{d.metric} {num(d.old)} \u2192 {num(d.new)}" + (" (regression)" if d.regression else "")
                     for d in mine)
    return Change(", ".join(words), bool(worse), bool(better), any(d.regression for d in mine), full)


def _is_worse(d: Delta) -> bool:
    direction = better_direction(d.metric)
    if direction is None or not isinstance(d.old, (int, float)) or not isinstance(d.new, (int, float)):
        return False
    return d.new > d.old if direction == "lower" else d.new < d.old


def _is_better(d: Delta) -> bool:
    return better_direction(d.metric) is not None and not _is_worse(d) and d.old != d.new
