"""report.html: one self-contained page (inline CSS and script, plots as base64 PNG; no network, opens from disk).

It answers an embedded engineer's first questions at a glance, in this order: which builds failed and why
(failed builds first, their cause in the main table), does each fit (every pool's use against its size,
headroom), how fast (ms, inferences/s, clock), how accurate (SNR, float vs int8 top-1, debug-numerics' first
bad layer), what runs on the CPU and why (the per-node placement with its rule and partition), what changed
against the baseline and across the stored runs. The main table sorts by any column and filters by text.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from npubuild.fileio import write_text
from npubuild.report.brief import failure_cause, num, plain_message
from npubuild.report.history import TREND_METRICS, moved, run_labels, series
from npubuild.report.markup import CSS, SCRIPT, cell, fmt, img, link, meter, table
from npubuild.report.numerics import worst_node_text
from npubuild.report.plots import cached_png, layers_svg, pools_svg
from npubuild.report.precision import precision_html
from npubuild.report.regress import Comparison, build_id
from npubuild.report.status import RANK, Status

LAYER_BARS = 30  # a per-layer chart's costliest ONNX nodes; the rest are summed into one bar
ARTIFACT_NAMES = (("tosa", "TOSA"), ("vela", "Vela model"), ("vela_log", "vela.log"), ("per_layer_csv", "per-layer CSV"),
                  ("firmware_c", "firmware .c"), ("firmware_h", "firmware .h"), ("deployment", "deployment.json"))
SHORT_NAMES = {"Vela model": "Vela", "per-layer CSV": "CSV", "firmware .c": ".c", "firmware .h": ".h",
               "deployment.json": "deploy", "vela.log": "log"}  # in the main table, where width is short
STATUS_ORDER = RANK  # failed first, then skipped, host only, mostly host, passed


def ordered(builds: list[dict], regressed: set[str] | frozenset[str] = frozenset()) -> list[dict]:
    """Failed builds first, then skipped, then the regressed ones, then the rest; by id within each."""
    return sorted(builds, key=lambda b: (STATUS_ORDER.get(b["status"], 0), build_id(b) not in regressed, build_id(b)))


def _artifacts(b: dict, base_dir: Path | None, short: bool = False) -> str:
    arts = b.get("artifacts") or {}
    links = (link(arts.get(k), SHORT_NAMES.get(label, label) if short else label, base_dir) for k, label in ARTIFACT_NAMES)
    return " &middot; ".join(x for x in links if x) or "-"


# --------------------------------------------------------------------------- per-layer data


def node_layers(m: dict) -> list[dict]:
    """Vela's per-layer rows summed per ONNX node, in execution order: cycles, compute cycles, the slowest
    memory's access cycles, the op type, and whether the node is memory- or compute-bound."""
    op_of = {p["node"]: p["op_type"] for p in m.get("offloads") or []}
    nodes: dict[str, dict] = {}
    for i, lay in enumerate(m.get("layers") or []):
        name = str(lay.get("onnx_node") or lay.get("tensor") or f"layer {i}")
        n = nodes.setdefault(name, {"node": name, "op_type": op_of.get(name) or str(lay.get("npu_op") or "?"),
                                    "npu_ops": [], "cycles": 0.0, "compute": 0.0, "memory": 0.0, "macs": 0})
        n["npu_ops"].append(str(lay.get("npu_op") or "?"))
        n["cycles"] += float(lay.get("cycles") or 0)
        n["compute"] += float(lay.get("npu_cycles") or 0)
        n["memory"] += max(float(lay.get(k) or 0) for k in ("sram_access_cycles", "dram_access_cycles",
                                                            "on_flash_access_cycles", "off_flash_access_cycles"))
        n["macs"] += int(lay.get("macs") or 0)
    for n in nodes.values():
        n["bound"] = "memory" if n["memory"] > n["compute"] else "compute"
    return list(nodes.values())


def _layer_chart(b: dict, nodes: list[dict], uid: str) -> str:
    keep = {id(n) for n in sorted(nodes, key=lambda n: -n["cycles"])[:LAYER_BARS]}
    bars = [(n["node"][:34], n["cycles"], n["op_type"], n["bound"] == "memory") for n in nodes if id(n) in keep]
    rest = [n for n in nodes if id(n) not in keep]
    if rest:
        bars.append((f"({len(rest)} other nodes)", sum(n["cycles"] for n in rest), "other", False))
    return layers_svg(f"Cycles per ONNX node: {build_id(b)}", bars, uid)


def _layer_table(nodes: list[dict], total: float) -> str:
    top = sorted(nodes, key=lambda n: -n["cycles"])[:8]
    rows = [[escape(n["node"]), escape(n["op_type"]), escape(", ".join(dict.fromkeys(n["npu_ops"]))),
             cell(n["cycles"], fmt(int(n["cycles"]))), cell(n["cycles"] / total * 100 if total else None,
                                                              fmt(n["cycles"] / total * 100 if total else None, 3)),
             cell(n["macs"]), f'<td class="{"bad" if n["bound"] == "memory" else ""}">{n["bound"]}</td>']
            for n in top]
    return "<h4>Costliest nodes</h4>" + table(["ONNX node", "op", "Vela ops", "cycles", "% of cycles", "MACs",
                                                 "bound"], rows)


# --------------------------------------------------------------------------- sections


def _accuracy(m: dict) -> tuple[float | None, str]:
    acc, flt = m.get("accuracy"), m.get("float_accuracy")
    if acc is None:
        return None, "-"
    drop = m.get("accuracy_drop")
    text = (f"{flt:.1%} &rarr; " if flt is not None else "") + f"{acc:.1%}"
    if drop is not None:
        text += f" ({-drop * 100:+.1f} pt)"
    return acc, text


def _first_bad_layer(b: dict) -> str:
    ln = b.get("layer_numerics")
    if not ln:
        return "-"
    if ln.get("first_lowering_error"):
        return escape(f"{ln['first_lowering_error']} (integer graph leaves the QDQ model)")
    if ln.get("first_drift"):
        return escape(f"{ln['first_drift']} (integer graph further from float than QDQ: {ln['drift_reason']})")
    node = ln.get("first_jump")
    return escape(f"{node} ({ln.get('jump_reason')})") if node else "no jump"


def _worst_pool(m: dict) -> dict | None:
    pools = [p for p in m.get("pools") or [] if p.get("size_kib")]
    return max(pools, key=lambda p: p["used_kib"] / p["size_kib"]) if pools else None


def status_class(status: str) -> str:
    """The CSS class of a status cell: passed, host (passed wholly or mostly on the host), failed, skipped."""
    return "host" if status in (Status.HOST_ONLY, Status.MOSTLY_HOST) else status if status in RANK else "failed"


def _problem(b: dict, comparison: Comparison | None) -> str:
    cause = failure_cause(b)
    parts = [f'<span class="bad">{escape(cause)}</span>'] if cause else []
    parts += [f'<span class="bad">{escape(w)}</span>' for w in b.get("warnings") or []]
    if comparison is not None:
        bid = build_id(b)
        regs = [r for r in comparison.regressions if r.build == bid and r.metric != "status"]
        if regs:
            parts.append("regressed: " + escape("; ".join(_delta_text(r) for r in regs)))
            changed = comparison.what_changed(bid)
            parts.append('<span class="muted">changed: ' + escape(", ".join(changed) or "nothing recorded")
                         + "</span>")
    return "<br>".join(parts) or "-"


def _delta_text(d) -> str:
    """`inference_ms 0.5437 -> 1.087 (+100%)`"""
    pct = f" ({(d.new - d.old) / d.old * 100:+.0f}%)" if isinstance(d.old, (int, float)) and d.old and isinstance(
        d.new, (int, float)) else ""
    return f"{d.metric} {num(d.old)} \u2192 {num(d.new)}{pct}"


def _main_table(builds: list[dict], comparison: Comparison | None, base_dir: Path | None) -> str:
    regressed = {r.build for r in comparison.regressions} if comparison else set()
    rows = []
    for b in builds:
        m = b.get("metrics") or {}
        bid = build_id(b)
        worst = _worst_pool(m)
        frac = worst["used_kib"] / worst["size_kib"] if worst else None
        fit = (meter(frac, not worst["fits"]) + escape(f"{worst['pool']} {frac:.0%}")) if worst else "-"
        headroom = worst["size_kib"] - worst["used_kib"] if worst else None  # of that fullest pool
        ms = m.get("inference_ms")
        rate = 1000 / ms if isinstance(ms, (int, float)) and ms > 0 else None
        acc, acc_text = _accuracy(m)
        cells = [f'<td class="id">{escape(bid)}</td>', f'<td class="{status_class(b["status"])}">{escape(b["status"])}</td>',
                 f'<td class="problem">{_problem(b, comparison)}</td>',
                 cell(frac, fit), cell(headroom, fmt(headroom, 4) if headroom is not None else "-"),
                 cell(ms), cell(rate, f"{rate:,.0f}" if rate else "-"), cell(b.get("clock_mhz")),
                 cell(m.get("npu_cycles")), cell(m.get("macs")),
                 cell(m.get("npu_offload"), f"{m['npu_offload']:.0%}" if isinstance(m.get("npu_offload"), (int, float))
                       else "-"),
                 cell(m.get("cpu_ops")), cell(m.get("sram_kib")), cell(m.get("offchip_kib")),
                 cell(m.get("tosa_snr_db"), fmt(m.get("tosa_snr_db"), 3)), cell(m.get("tosa_max_error_lsb")),
                 f"<td>{escape(worst_node_text(m))}</td>", cell(acc, acc_text), f"<td>{_first_bad_layer(b)}</td>", f'<td class="id">{_artifacts(b, base_dir, short=True)}</td>']
        problem = b["status"] != Status.PASSED or bid in regressed
        cls = ' class="regressed"' if bid in regressed else ""
        rows.append(f'<tr{cls} data-problem="{int(problem)}">' + "".join(cells) + "</tr>")
    head = ["build", "status", "problem", "fit (fullest pool)", "its headroom KiB", "inference ms", "inferences/s",
            "clock MHz", "NPU cycles", "MACs", "on NPU", "CPU nodes", "SRAM KiB", "off-chip KiB", "TOSA SNR dB",
            "max LSB", "worst node (own LSB)", "top-1 float &rarr; int8", "first bad layer", "artifacts"]
    ths = "".join(f'<th class="sort" onclick="sortBy(this)">{h}</th>' for h in head)
    return ('<p><input id="filter" placeholder="filter builds (spec, model, target, cause)" oninput="filterRows()"> '
            '<label><input type="checkbox" id="problems" onchange="filterRows()"> problems only</label> '
            '<span class="muted">click a column to sort</span></p>'
            f'<table id="builds"><thead><tr>{ths}</tr></thead><tbody>\n' + "\n".join(rows) + "\n</tbody></table>")


def _fit_section(builds: list[dict]) -> list[str]:
    rows = []
    for b in builds:
        pools = (b.get("metrics") or {}).get("pools") or []
        split = len({p.get("partition", 0) for p in pools}) > 1  # one set of pools per NPU partition
        for p in pools:
            size = p.get("size_kib") or 0
            frac = p["used_kib"] / size if size else None
            roles = ", ".join(f"{r} {kib:.1f}" for r, kib in (p.get("roles") or {}).items())
            pool = f"{p['pool']} (NPU partition {p.get('partition', 0)})" if split else p["pool"]
            rows.append([escape(build_id(b)), escape(pool), escape(p.get("kind", "")), escape(roles or "-"),
                         cell(p["used_kib"]), cell(size), cell(size - p["used_kib"]),
                         cell(frac, meter(frac, not p["fits"]) + (f"{frac:.0%}" if frac is not None else "-")),
                         '<td>yes</td>' if p["fits"] else '<td class="bad">NO</td>'])
    if not rows:
        return []
    pools = [(build_id(b), b["metrics"]["pools"]) for b in builds if (b.get("metrics") or {}).get("pools")]
    return ['<h2 id="fit">Does it fit? Memory per pool</h2>',
            table(["build", "pool", "kind", "holds (KiB)", "used KiB", "size KiB", "headroom KiB", "used", "fits"],
                   rows, sortable=True),
            "<details><summary>chart</summary>" + pools_svg(pools) + "</details>"]


def _placement_rows(offloads: list[dict]) -> list[list[str]]:
    rows = []
    for p in offloads:
        where = (f"NPU partition {p['partition']}" if p["kind"] == "npu"
                 else f'<span class="bad">CPU</span> (host partition {p["partition"]})')
        rows.append([escape(p["node"]), escape(p["op_type"]), escape(p.get("precision") or "int8"), f"<td>{where}</td>",
                     escape(", ".join(p.get("tosa_ops") or []) or "-"), escape(p.get("rule") or "-"),
                     escape(p.get("reason") or "-")])
    return rows


def _placement_section(builds: list[dict]) -> list[str]:
    with_nodes = [b for b in builds if (b.get("metrics") or {}).get("offloads")]
    if not with_nodes:
        return []
    out = ['<h2 id="placement">What runs where: NPU and CPU placement per node</h2>']
    host = [b for b in with_nodes if any(p["kind"] != "npu" for p in b["metrics"]["offloads"])]
    all_npu = [b for b in with_nodes if b not in host]
    if all_npu:
        out.append(f"<p>{len(all_npu)} build(s) run every node on the NPU in one partition each"
                   + (": " + escape(", ".join(build_id(b) for b in all_npu if b["metrics"].get("npu_partitions") == 1))
                      if len(all_npu) <= 12 else "") + ".</p>")
    for b in sorted(host, key=build_id) + sorted(all_npu, key=build_id):
        m = b["metrics"]
        cpu = [p for p in m["offloads"] if p["kind"] != "npu"]
        parts = m.get("partition_graph") or []
        chain = " &rarr; ".join(f"{'NPU' if p['kind'] == 'npu' else 'CPU'} {p['index']} ({len(p.get('nodes', []))})"
                                for p in parts)
        head = (f"{escape(build_id(b))}: {len(cpu)} of {len(m['offloads'])} nodes on the CPU, "
                f"{m.get('npu_partitions')} NPU partition(s)" + (f"; order {chain}" if chain else ""))
        out.append(f"<details{' open' if cpu else ''}><summary>{head}</summary>"
                   + table(["node", "op", "precision", "runs on", "TOSA ops", "rule", "reason"],
                           _placement_rows(m["offloads"]),
                            sortable=True) + "</details>")
    return out


def _stage_note(s: dict) -> str:
    """Where a stage's result came from, or why it has none."""
    if s["status"] == "failed":
        return plain_message(s.get("error") or "failed")
    if s["status"] == "skipped":
        return s.get("reason") or "not run: an earlier stage failed or the run stopped"
    return "shared cache" if s.get("from_cache") else "earlier run" if s.get("cached") else "this run"


def _roofline_line(m: dict) -> str:
    """One line: the build's roofline bound against Vela's estimate and the layer furthest from its bound."""
    roof = m.get("roofline")
    if not roof or m.get("bound_ms") is None:
        return ""
    worst = roof["worst_layers"][0] if roof.get("worst_layers") else None
    tail = (f"; furthest from its bound: {escape(str(worst.get('onnx_node') or worst['tensor']))} "
            f"({worst['estimated_ms']:.4f} vs {worst['bound_ms']:.4f} ms, {escape(worst['bound_by'])}-bound)"
            if worst and worst["gap_ms"] > 0 else "")
    return (f"<p><b>Roofline:</b> bound {m['bound_ms']:.4f} ms of {fmt(m.get('inference_ms'))} ms estimated, "
            f"efficiency {m['efficiency']:.2f}{tail}</p>")


def _build_details(b: dict, cache_dir: Path | None, base_dir: Path | None, uid: str = "h0",
                   regressed: bool = False) -> str:
    m = b.get("metrics") or {}
    opened = " open" if b["status"] == "failed" or regressed else ""  # the ones to look at
    parts = [f'<details{opened}><summary class="{status_class(b["status"])}">{escape(build_id(b))}: '
             f'{escape(b["status"])}' + (f" &mdash; {escape(failure_cause(b) or '')}" if failure_cause(b) else "")
             + "</summary>"]
    for e in b.get("errors", []):
        parts.append(f'<p class="bad">{escape(plain_message(e))}</p>')
    for w in b.get("warnings") or []:
        parts.append(f'<p class="bad">warning: {escape(w)}</p>')
    parts.append(f"<p>Artifacts: {_artifacts(b, base_dir)}</p>")
    parts.append("<h4>Stages</h4>" + table(
        ["stage", "status", "seconds", "from / why"],
        [[escape(k), escape(s["status"]), cell(s.get("seconds"), fmt(s.get("seconds"), 3)), escape(_stage_note(s))]
         for k, s in b.get("stages", {}).items()]))
    gates = [[escape(g["name"]), escape(g["metric"]), cell(g["limit"]), cell(g["value"]),
              "<td>yes</td>" if g["ok"] else '<td class="bad">NO</td>'] for g in b.get("gates", [])]
    gates += [[escape(g["name"]), escape(g["metric"]), cell(g["limit"]), cell(None),
               '<td class="muted">not evaluated</td>'] for g in b.get("unchecked_gates", [])]
    if gates:
        parts.append("<h4>Gates</h4>" + table(["gate", "metric", "limit", "value", "ok"], gates))
    parts.append(_roofline_line(m))
    parts.append(precision_html(m))
    nodes = node_layers(m)
    if nodes:
        total = sum(n["cycles"] for n in nodes)
        parts.append(_layer_chart(b, nodes, uid))
        parts.append(_layer_table(nodes, total))
    ln = b.get("layer_numerics")
    if ln:
        rows = [[escape(r["node"]), escape(r["op_type"]), cell(r.get("tosa_snr_db"), fmt(r.get("tosa_snr_db"), 3)),
                 cell(r.get("max_error_lsb")), cell(r.get("quant_snr_db"), fmt(r.get("quant_snr_db"), 3)),
                 '<td class="bad">first jump</td>' if r["node"] == ln.get("first_jump") else
                 '<td class="bad">leaves QDQ</td>' if r["node"] == ln.get("first_lowering_error") else "<td></td>"]
                for r in ln.get("layers", [])]
        parts.append(f"<h4>debug-numerics ({ln.get('samples')} samples): first bad layer {_first_bad_layer(b)}</h4>"
                     + table(["node", "op", "SNR vs QDQ dB", "max LSB", "SNR vs float dB", ""], rows))
    parts.append("</details>")
    return "\n".join(parts)


def _baseline_section(report: dict, comparison: Comparison, baseline: str | None, cache_dir: Path | None) -> list[str]:
    c = comparison
    h = [f'<h2 id="baseline">Against the baseline</h2><p>Baseline: <code>{escape(baseline or "")}</code></p>']
    if c.version_changes:
        h.append("<p><b>Tool versions changed:</b> " + ", ".join(
            f"{escape(k)} {escape(a)} &rarr; {escape(b)}" for k, (a, b) in c.version_changes.items()) + "</p>")
    if c.commit_change:
        h.append(f"<p><b>Commit:</b> {escape(c.commit_change[0] or '?')} &rarr; {escape(c.commit_change[1] or '?')}</p>")
    if c.regressions:
        items = []
        for r in c.regressions:
            changed = c.changes.get(r.build)
            items.append(f'<li class="bad">{escape(r.line())}</li>' if not changed else
                         f'<li class="bad">{escape(r.line())} <span class="muted">({escape(", ".join(changed))})</span></li>')
        h.append(f'<p class="bad">{len(c.regressions)} regression(s)</p><ul>' + "".join(items) + "</ul>")
    else:
        h.append("<p>No regression.</p>")
    h.append(f"<p>{c.unchanged} build(s) with unchanged metrics; {len(c.failed)} did not pass"
             + (f"; {len(c.new_builds)} new" if c.new_builds else "")
             + (f"; {len(c.not_asked)} not asked for in this run" if c.not_asked else "") + ".</p>")
    if c.deltas:
        h.append(table(["build", "metric", "old", "new", "change", "allowed", "regression"], [
            [escape(d.build), escape(d.metric), cell(d.old), cell(d.new), escape(d.change), escape(d.limit or "-"),
             '<td class="bad">yes</td>' if d.regression else "<td>no</td>"] for d in c.deltas], sortable=True))
    metrics, trend = _trend_rows(c)
    if trend:
        h.append(img(cached_png(cache_dir, "trend", (metrics, trend)), "metric trend"))
    return h


def _history_section(runs: list[dict], cache_dir: Path | None) -> list[str]:
    if len(runs) < 2:
        return []
    labels = run_labels(runs)
    h = [f'<h2 id="history">History: {len(runs)} stored runs</h2>']
    steady = []
    for metric in TREND_METRICS:
        rows = series(runs, metric)
        if not rows:
            continue
        if not any(moved(vals) for _, vals in rows):
            steady.append(metric)  # a flat chart says nothing a sentence cannot
            continue
        h.append(img(cached_png(cache_dir, "history", (metric, labels, rows)), f"{metric} per run"))
    if steady:
        h.append(f"<p>Unchanged over these runs for every build: {escape(', '.join(steady))}.</p>")
    return h


def render_html(report: dict, comparison: Comparison | None = None, baseline: str | None = None,
                cache_dir: Path | None = None, history: list[dict] | None = None, base_dir: Path | None = None) -> str:
    """`history`: stored runs, oldest first (report.history); `base_dir`: where the page is written, for
    relative links to the artifacts."""
    builds = ordered(report.get("builds", []), {r.build for r in comparison.regressions} if comparison else set())
    counts = {s: sum(1 for b in builds if b["status"] == s) for s in Status}
    hosted = counts[Status.HOST_ONLY] + counts[Status.MOSTLY_HOST]
    meta = " &middot; ".join(escape(str(x)) for x in (report.get("created"), report.get("run_id"),
                                                       report.get("commit") and f"commit {report['commit']}") if x)
    h = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>npubuild report</title>",
         f"<style>{CSS}</style><script>{SCRIPT}</script></head><body><h1>npubuild report</h1>",
         f'<p>{len(builds)} builds: {counts[Status.PASSED] + hosted} passed'
         + (f' (<span class="bad">{hosted} wholly or mostly on the host</span>)' if hosted else "")
         + f', <span class="{"bad" if counts[Status.FAILED] else ""}">'
         f'{counts[Status.FAILED]} failed</span>, {counts[Status.SKIPPED]} skipped.'
         + (f' <span class="muted">{meta}</span>' if meta else "") + "</p>"]
    sections = [("baseline", "baseline") if comparison is not None else None,
                ("history", "history") if history and len(history) > 1 else None, ("builds", "builds"),
                ("fit", "memory fit"), ("placement", "placement"), ("details", "details per build")]
    h.append('<p class="muted">' + " &middot; ".join(f'<a href="#{a}">{t}</a>' for a, t in filter(None, sections))
             + "</p>")
    if comparison is not None:
        h += _baseline_section(report, comparison, baseline, cache_dir)
    h += _history_section(history or [], cache_dir)
    h.append('<h2 id="builds">Builds</h2>')
    h.append(_main_table(builds, comparison, base_dir))
    h += _fit_section(builds)
    h += _placement_section(builds)
    h.append('<h2 id="details">Details per build</h2>')
    regressed = {r.build for r in comparison.regressions} if comparison else set()
    h += [_build_details(b, cache_dir, base_dir, f"stripes{i}", build_id(b) in regressed) for i, b in enumerate(builds)]
    h.append("<h2>Tool versions</h2>" + table(["tool", "version"], [
        [escape(k), escape(str(v))] for k, v in report.get("versions", {}).items()]))
    h.append("</body></html>")
    return "\n".join(h) + "\n"


def _trend_rows(c: Comparison) -> tuple[list[str], list[tuple[str, list[float | None]]]]:
    """The metrics that changed for some build (one chart panel each) and, per changed build, the percent
    change of each."""
    pct: dict[str, dict[str, float]] = {}
    for d in c.deltas:
        if d.metric in TREND_METRICS and isinstance(d.old, (int, float)) and d.old:
            pct.setdefault(d.build, {})[d.metric] = round((d.new - d.old) / d.old * 100, 4)
    metrics = [m for m in TREND_METRICS if any(m in vals for vals in pct.values())]
    return metrics, [(bid, [vals.get(m) for m in metrics]) for bid, vals in pct.items()]


def write_html(path: Path, report: dict, comparison: Comparison | None = None, baseline: str | None = None,
               cache_dir: Path | None = None, history: list[dict] | None = None) -> None:
    write_text(path, render_html(report, comparison, baseline, cache_dir, history, path.parent.resolve()))
