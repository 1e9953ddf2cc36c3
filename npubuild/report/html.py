"""report.html: one self-contained page (inline CSS, plots as base64 PNG; no network, opens from disk)."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from npubuild.fileio import write_text
from npubuild.report.plots import cached_png
from npubuild.report.regress import Comparison, build_id

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}
th{background:#f3f3f3}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.passed{background:#dff0d8}.failed{background:#f2dede}.skipped{background:#fcf8e3}
.bad{color:#a00;font-weight:bold}
details{margin:.3em 0}summary{cursor:pointer}
img{max-width:100%}
"""
MAX_LAYER_CHARTS = 6
TREND_METRICS = ("inference_ms", "npu_cycles", "sram_kib", "offchip_kib")
COLUMNS = (("npu_ops", "NPU ops"), ("cpu_ops", "CPU ops"), ("npu_offload", "offload"), ("sram_kib", "SRAM KiB"),
           ("offchip_kib", "off-chip KiB"), ("inference_ms", "inference ms"), ("npu_cycles", "NPU cycles"),
           ("macs", "MACs"), ("tosa_max_error_lsb", "TOSA max LSB"), ("tosa_snr_db", "TOSA SNR dB"),
           ("quant_snr_db", "quant SNR dB"))


def _v(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return escape(str(v))


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _table(head: list[str], rows: list[list[str]], numeric_from: int = 1) -> str:
    out = ["<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        cells = [f'<td class="n">{c}</td>' if i >= numeric_from else f"<td>{c}</td>" for i, c in enumerate(r)]
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


def _layer_chart_builds(builds: list[dict], comparison: Comparison | None) -> set[str]:
    """Builds that get a per-layer cycles chart: failed, regressed, then the slowest, MAX_LAYER_CHARTS in all.

    Drawing is ~0.1-0.5 s a chart: one for each of a nightly's hundreds of builds would dominate the report
    step; the others get a table of their costliest layers (all layers are in report.json).
    """
    regressed = {r.build for r in comparison.regressions} if comparison else set()
    with_layers = [b for b in builds if b.get("metrics", {}).get("layers")]
    ranked = sorted(with_layers, key=lambda b: (b["status"] == "passed", build_id(b) not in regressed,
                                                -(b["metrics"].get("inference_ms") or 0.0)))
    return {build_id(b) for b in ranked[:MAX_LAYER_CHARTS]}


def _layer_table(layers: list[dict]) -> str:
    top = sorted(layers, key=lambda lay: lay.get("cycles") or 0, reverse=True)[:5]
    return "<h4>Costliest layers</h4>" + _table(["layer", "op", "cycles", "MACs"], [
        [escape(str(lay.get("onnx_node") or lay.get("tensor") or "-")), escape(str(lay.get("npu_op") or "-")),
         _v(lay.get("cycles")), _v(lay.get("macs"))] for lay in top], numeric_from=2)


def _roofline_line(m: dict) -> str:
    """One line: the build's roofline bound against Vela's estimate and the layer furthest from its bound."""
    roof = m.get("roofline")
    if not roof or m.get("bound_ms") is None:
        return ""
    worst = roof["worst_layers"][0] if roof.get("worst_layers") else None
    tail = (f"; furthest from its bound: {escape(str(worst.get('onnx_node') or worst['tensor']))} "
            f"({worst['estimated_ms']:.4f} vs {worst['bound_ms']:.4f} ms, {escape(worst['bound_by'])}-bound)"
            if worst and worst["gap_ms"] > 0 else "")
    return (f"<p><b>Roofline:</b> bound {m['bound_ms']:.4f} ms of {_v(m.get('inference_ms'))} ms estimated, "
            f"efficiency {m['efficiency']:.2f}{tail}</p>")


def _build_details(b: dict, cache_dir: Path | None, chart: bool = True) -> str:
    m = b.get("metrics", {})
    parts = [f'<details><summary class="{b["status"]}">{escape(build_id(b))}: {b["status"]}</summary>']
    for e in b.get("errors", []):
        parts.append(f'<p class="bad">{escape(e)}</p>')
    parts.append("<h4>Stages</h4>" + _table(
        ["stage", "status", "seconds", "cached"],
        [[escape(k), escape(s["status"]), _v(s.get("seconds")), "yes" if s.get("cached") else "no"]
         for k, s in b.get("stages", {}).items()], numeric_from=2))
    if b.get("gates"):
        parts.append("<h4>Gates</h4>" + _table(
            ["gate", "metric", "limit", "value", "ok"],
            [[escape(g["name"]), escape(g["metric"]), _v(g["limit"]), _v(g["value"]),
              "yes" if g["ok"] else '<span class="bad">NO</span>'] for g in b["gates"]], numeric_from=2))
    parts.append(_roofline_line(m))
    if m.get("pools"):
        parts.append("<h4>Memory pools</h4>" + _table(
            ["pool", "kind", "used KiB", "size KiB", "fits"],
            [[escape(p["pool"]), escape(p["kind"]), _v(p["used_kib"]), _v(p["size_kib"]),
              "yes" if p["fits"] else '<span class="bad">NO</span>'] for p in m["pools"]], numeric_from=2))
    layers = m.get("layers") or m.get("per_layer")  # Vela's per-layer performance, when the build recorded it
    if layers and not chart:
        parts.append(_layer_table(layers))
    elif layers:
        data = [(str(lay.get("onnx_node") or lay.get("name") or lay.get("tensor") or i), float(lay.get("cycles") or 0))
                for i, lay in enumerate(layers)]
        parts.append(_img(cached_png(cache_dir, "layers", (f"Cycles per layer: {build_id(b)}", data)),
                     "per-layer cycles"))
    parts.append("</details>")
    return "\n".join(parts)


def render_html(report: dict, comparison: Comparison | None = None, baseline: str | None = None,
                cache_dir: Path | None = None) -> str:
    builds = report.get("builds", [])
    counts = {s: sum(1 for b in builds if b["status"] == s) for s in ("passed", "failed", "skipped")}
    h = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>npubuild report</title>",
         f"<style>{CSS}</style></head><body><h1>npubuild report</h1>",
         f"<p>{len(builds)} builds: {counts['passed']} passed, {counts['failed']} failed, "
         f"{counts['skipped']} skipped.</p>"]
    if comparison is not None:
        h.append(f"<h2>Against the baseline</h2><p>Baseline: <code>{escape(baseline or '')}</code></p>")
        if comparison.version_changes:
            h.append("<p><b>Tool versions changed:</b> " + ", ".join(
                f"{escape(k)} {escape(a)} &rarr; {escape(b)}" for k, (a, b) in comparison.version_changes.items())
                + "</p>")
        if comparison.regressions:
            h.append(f'<p class="bad">{len(comparison.regressions)} regression(s)</p><ul>' + "".join(
                f'<li class="bad">{escape(r.line())}</li>' for r in comparison.regressions) + "</ul>")
        else:
            h.append("<p>No regression.</p>")
        if comparison.deltas:
            h.append(_table(["build", "metric", "old", "new", "change", "allowed", "regression"], [
                [escape(d.build), escape(d.metric), _v(d.old), _v(d.new), escape(d.change), escape(d.limit or "-"),
                 '<span class="bad">yes</span>' if d.regression else "no"] for d in comparison.deltas],
                numeric_from=2))
        trend = _trend_rows(report, comparison)
        if trend:
            h.append(_img(cached_png(cache_dir, "trend", (list(TREND_METRICS), trend)), "metric trend"))
    h.append("<h2>Builds</h2>")
    rows = []
    for b in builds:
        m = b.get("metrics", {})
        bad = [g["name"] for g in b.get("gates", []) if not g["ok"]]
        rows.append([escape(build_id(b)), f'<span class="{b["status"]}">{b["status"]}</span>',
                     *(_v(m.get(k)) for k, _ in COLUMNS), escape(", ".join(bad)) or "-"])
    h.append(_table(["build", "status", *(c for _, c in COLUMNS), "failed gates"], rows, numeric_from=2))
    h.append("<h2>Offload</h2>" + _table(
        ["build", "NPU ops", "CPU ops", "offload", "Vela NPU ops", "Vela CPU ops"],
        [[escape(build_id(b)), *(_v(b.get("metrics", {}).get(k)) for k in
                                 ("npu_ops", "cpu_ops", "npu_offload", "vela_npu_ops", "vela_cpu_ops"))]
         for b in builds]))
    pools = [(build_id(b), b["metrics"]["pools"]) for b in builds if b.get("metrics", {}).get("pools")]
    if pools:
        h.append("<h2>Memory use per pool</h2>" + _img(cached_png(cache_dir, "pools", (pools,)), "memory per pool"))
    h.append("<h2>Details</h2>")
    charted = _layer_chart_builds(builds, comparison)
    h += [_build_details(b, cache_dir, build_id(b) in charted) for b in builds]
    h.append("<h2>Tool versions</h2>" + _table(["tool", "version"], [
        [escape(k), escape(str(v))] for k, v in report.get("versions", {}).items()], numeric_from=9))
    h.append("</body></html>")
    return "\n".join(h) + "\n"


def _trend_rows(report: dict, c: Comparison) -> list[tuple[str, list[float | None]]]:
    pct: dict[str, dict[str, float]] = {}
    for d in c.deltas:
        if d.metric in TREND_METRICS and isinstance(d.old, (int, float)) and d.old:
            pct.setdefault(d.build, {})[d.metric] = round((d.new - d.old) / d.old * 100, 4)
    return [(bid, [vals.get(m) for m in TREND_METRICS]) for bid, vals in pct.items()]


def write_html(path: Path, report: dict, comparison: Comparison | None = None, baseline: str | None = None,
               cache_dir: Path | None = None) -> None:
    write_text(path, render_html(report, comparison, baseline, cache_dir))
