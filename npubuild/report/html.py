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

from npubuild.errors import plain_message
from npubuild.fileio import write_text
from npubuild.report import glance
from npubuild.report.brief import failure_cause, num
from npubuild.report.history import TREND_METRICS, moved, run_labels, series
from npubuild.report.markup import CSS, SCRIPT, cell, fmt, img, link, meter, table
from npubuild.report.numerics import agreement_text, evaluate_text, float_text, worst_node_text
from npubuild.report.plots import cached_png, deltas_svg, layers_svg, page_colours, pools_svg
from npubuild.report.precision import precision_html
from npubuild.report.regress import Comparison, better_direction, build_id
from npubuild.report.status import RANK, Status, passed

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


def _layer_chart(b: dict, nodes: list[dict], uid: str, colours: dict[str, str] | None = None) -> str:
    keep = {id(n) for n in sorted(nodes, key=lambda n: -n["cycles"])[:LAYER_BARS]}
    bars = [(n["node"][:34], n["cycles"], n["op_type"], n["bound"] == "memory") for n in nodes if id(n) in keep]
    rest = [n for n in nodes if id(n) not in keep]
    if rest:
        bars.append((f"({len(rest)} other nodes)", sum(n["cycles"] for n in rest), "other", False))
    return layers_svg(f"Cycles per ONNX node: {build_id(b)}", bars, uid, colours)


def op_colours(builds: list[dict]) -> dict[str, str]:
    """The page's op types by their cycles over every build, heaviest first, each with its own colour: the
    charts keep these where a chart's colours stay distinct (plots.colour_of)."""
    weight: dict[str, float] = {}
    for b in builds:
        for n in node_layers(b.get("metrics") or {}):
            weight[n["op_type"]] = weight.get(n["op_type"], 0.0) + n["cycles"]
    return page_colours(sorted(weight, key=lambda op: (-weight[op], op)))


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


def status_class(status: str) -> str:
    """The CSS class of a status cell: passed, host (passed wholly or mostly on the host), failed, skipped."""
    return "host" if status in (Status.HOST_ONLY, Status.MOSTLY_HOST) else status if status in RANK else "failed"


def _problem(b: dict, comparison: Comparison | None) -> str:
    cause = glance.short_cause(failure_cause(b))
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
    return " &middot; ".join(parts) or "-"


def _problem_text(b: dict, comparison: Comparison | None) -> str:
    """The problem cell's whole text, for its tooltip (the cell is one line, cut at its width)."""
    import re
    from html import unescape

    return unescape(re.sub(r"<[^>]+>", "", _problem(b, comparison)))


def _delta_text(d) -> str:
    """`inference_ms 0.5437 -> 1.087 (+100%)`"""
    pct = f" ({(d.new - d.old) / d.old * 100:+.0f}%)" if isinstance(d.old, (int, float)) and d.old and isinstance(
        d.new, (int, float)) else ""
    return f"{d.metric} {num(d.old)} \u2192 {num(d.new)}{pct}"


def _anchor(i: int) -> str:
    return f"b{i}"


def _fit_cell(m: dict, b: dict) -> str:
    fit = glance.fullest_pool(m)
    if fit is None:
        why = "not compiled: " + (failure_cause(b) or "no pool figures") if not passed(b["status"]) else "no pools"
        return f'<td class="n" data-v="" title="{escape(why)}">-</td>'
    title = (f"fullest pool {fit.pool}: {fit.used_kib:.1f} of {fit.size_kib:g} KiB, headroom {fit.headroom_kib:.1f} KiB"
             + ("; a lower bound from the model's shapes (it failed before Vela)" if fit.lower_bound else ""))
    return (f'<td class="fit{" bad" if not fit.fits else ""}" data-v="{fit.fraction:.6g}" title="{escape(title)}">'
            f"{meter(min(fit.fraction, 1.0), not fit.fits)}{escape(fit.text())}</td>")


def _accuracy_cells(m: dict) -> str:
    a = glance.accuracy(m)
    float_title = ("against the float model: SNR of the int8 outputs (the lowest output)"
                   + (f"; below {glance.LOW_SNR_DB:g} dB the int8 model may have lost the float model's accuracy"
                      if a.low else ""))
    return (f'<td class="n{" warn" if a.low else ""}" data-v="{"" if a.vs_float_db is None else a.vs_float_db}" '
            f'title="{escape(float_title)}">{escape(a.vs_float)}</td>'
            f'<td class="n" data-v="{"" if a.vs_qdq_db is None else a.vs_qdq_db}" title="the integer TOSA graph '
            f'against the QDQ model it implements: SNR and largest error">{escape(a.vs_qdq)}</td>')


def _change_cell(bid: str, comparison: Comparison | None) -> str:
    c = glance.change(bid, comparison)
    cls = "bad" if c.regression else "worse" if c.worse else "better" if c.better else "muted"
    return f'<td class="change {cls}" title="{escape(c.full)}">{escape(c.text or "-")}</td>'


def _num_cell(value, text: str, title: str = "") -> str:
    """A numeric cell (its raw value to sort by) with a tooltip saying more than its few characters."""
    v = value if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    tip = f' title="{escape(title)}"' if title else ""
    return f'<td class="n" data-v="{v}"{tip}>{escape(text)}</td>'


def _ms_cell(m: dict) -> str:
    ms = m.get("inference_ms")
    if not isinstance(ms, (int, float)) or ms <= 0:
        return _num_cell(None, "-")
    return _num_cell(ms, glance.milliseconds(ms), glance.speed_text(m))


def _main_table(builds: list[dict], comparison: Comparison | None, change_against: str) -> str:
    """One row per build, one short cell per question (fit, speed, NPU share, accuracy against float and
    against the QDQ model, change, cause), so that every answer is on a laptop's first screen; the build's
    name opens its panel below with every figure, artifact and chart."""
    regressed = {r.build for r in comparison.regressions} if comparison else set()
    rows = []
    for i, b in enumerate(builds):
        m = b.get("metrics") or {}
        bid = build_id(b)
        # the model first (what tells builds apart), its spec after it in grey where the names differ
        name = escape(b["model"]) + ("" if b["model"] == b["spec"] else f' <span class="muted">{escape(b["spec"])}</span>')
        off = m.get("npu_offload")
        parts = m.get("npu_partitions")
        npu_title = (f"{off:.1%} of the ops on the NPU" + (f", in {parts} NPU partitions" if isinstance(parts, int)
                                                           and parts > 1 else "")) if isinstance(off, (int, float)) else ""
        cells = [f'<td class="id" title="{escape(bid)}"><a href="#{_anchor(i)}" onclick="openPanel(\'{_anchor(i)}\')">'
                 f"{name}</a></td>",
                 f'<td class="id">{escape(b["target"])}</td>',
                 f'<td class="{status_class(b["status"])}">{escape(b["status"])}</td>',
                 _fit_cell(m, b),
                 _ms_cell(m),
                 _num_cell(off, f"{off:.0%}" if isinstance(off, (int, float)) else "-", npu_title),
                 _accuracy_cells(m),
                 _change_cell(bid, comparison),
                 f'<td class="problem" title="{escape(_problem_text(b, comparison))}">{_problem(b, comparison)}</td>']
        problem = b["status"] != Status.PASSED or bid in regressed
        cls = ' class="regressed"' if bid in regressed else ""
        rows.append(f'<tr{cls} data-problem="{int(problem)}" data-build="{escape(bid)}">' + "".join(cells) + "</tr>")
    head = [("build", "spec/model: opens its panel below"), ("target", ""), ("status", ""),
            ("fit", "the fullest memory pool: share used (need/size where it does not fit)"),
            ("ms", "Vela's estimated inference time in ms (inferences per second in the tooltip)"),
            ("NPU", "share of the model's ops on the NPU"),
            ("vs float", "accuracy against the float model"),
            ("TOSA vs QDQ", "the integer graph against the QDQ model: SNR, largest error"),
            ("change", change_against or "no baseline: `npubuild report --baseline OLD/report.json`"),
            ("problem", "why a build failed, what regressed")]
    cols = "".join(f'<col class="c-{h.split()[0].lower()}">' for h, _ in head)
    ths = "".join('<th class="sort" onclick="sortBy(this)"' + (f' title="{escape(t)}"' if t else "") + f">{h}</th>"
                  for h, t in head)
    return ('<p class="toolbar" id="builds"><input id="filter" placeholder="filter builds (spec, model, target, cause)" '
            'oninput="filterRows()"> <label><input type="checkbox" id="problems" onchange="filterRows()"> problems only'
            '</label> <span class="muted">click a column to sort, a build for its panel; change: '
            f'{escape(change_against or "none (no baseline, no previous run)")}</span></p>'
            f'<table id="builds-table"><colgroup>{cols}</colgroup><thead><tr>{ths}</tr></thead><tbody>\n'
            + "\n".join(rows) + "\n</tbody></table>")


def _fit_section(builds: list[dict]) -> list[str]:
    """Every build's pools against their sizes, a row per build and pool: a build that does not fit shows what
    it needs (from the failed pool check), one not compiled says so, so the table answers "does it fit?" for
    every build."""
    rows = []
    for b in builds:
        pools = (b.get("metrics") or {}).get("pools") or []
        if not pools:
            why = failure_cause(b) or "no pool figures"
            rows.append([escape(build_id(b)), "-", "-", "-", cell(None), cell(None), cell(None), cell(None),
                         f'<td class="muted">not known: {escape(why)}</td>'])
            continue
        split = len({p.get("partition", 0) for p in pools}) > 1  # one set of pools per NPU partition
        for p in pools:
            size = p.get("size_kib") or 0
            frac = p["used_kib"] / size if size else None
            roles = ", ".join(f"{r} {kib:.1f}" for r, kib in (p.get("roles") or {}).items())
            pool = f"{p['pool']} (NPU partition {p.get('partition', 0)})" if split else p["pool"]
            bound = "at least " if p.get("lower_bound") else ""
            verdict = ('<td>yes</td>' if p["fits"] else
                       f'<td class="bad">NO: needs {bound}{p["used_kib"]:.1f} of {size:g} KiB</td>')
            rows.append([escape(build_id(b)), escape(pool), escape(p.get("kind", "")), escape(roles or "-"),
                         cell(p["used_kib"], (bound and "&ge; ") + fmt(p["used_kib"])), cell(size),
                         cell(size - p["used_kib"]),
                         cell(frac, meter(min(frac, 1.0) if frac is not None else None, not p["fits"])
                              + (f"{frac:.0%}" if frac is not None else "-")), verdict])
    if not rows:
        return []
    pools = [(build_id(b), b["metrics"]["pools"]) for b in builds if (b.get("metrics") or {}).get("pools")]
    return ['<h2 id="fit">Does it fit? Memory per pool</h2>',
            table(["build", "pool", "kind", "holds (KiB)", "used KiB", "size KiB", "headroom KiB", "used", "fits"],
                  rows, table_id="fit-table", sortable=True),
            ("<details><summary>chart</summary>" + pools_svg(pools) + "</details>" if pools else "")]


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
        on_host = [p for p in m["offloads"] if p["kind"] != "npu"]
        parts = m.get("partition_graph") or []
        chain = " &rarr; ".join(f"{'NPU' if p['kind'] == 'npu' else 'CPU'} {p['index']} ({len(p.get('nodes', []))})"
                                for p in parts)
        head = (f"{escape(build_id(b))}: {len(on_host)} of {len(m['offloads'])} nodes on the CPU, "
                f"{m.get('npu_partitions')} NPU partition(s)" + (f"; order {chain}" if chain else ""))
        out.append(f"<details{' open' if on_host else ''}><summary>{head}</summary>"
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


def _figures(b: dict) -> str:
    """Every headline figure of a build, the ones the Builds table leaves out included."""
    m = b.get("metrics") or {}
    fit = glance.fullest_pool(m)
    acc, acc_text = _accuracy(m)
    ms = m.get("inference_ms")
    off = m.get("npu_offload")
    rate = 1000 / ms if isinstance(ms, (int, float)) and ms > 0 else None
    pairs = [("inference ms", cell(ms)), ("inferences/s", cell(rate, f"{rate:,.0f}" if rate else "-")),
             ("clock MHz", cell(b.get("clock_mhz"))), ("NPU cycles", cell(m.get("npu_cycles"))),
             ("MACs", cell(m.get("macs"))),
             ("on NPU", cell(off, f"{off:.0%}" if isinstance(off, (int, float)) else "-")),
             ("CPU nodes", cell(m.get("cpu_ops"))), ("NPU partitions", cell(m.get("npu_partitions"))),
             ("SRAM KiB", cell(m.get("sram_kib"))), ("off-chip KiB", cell(m.get("offchip_kib"))),
             ("fullest pool", f"<td>{escape(fit.text()) if fit else '-'}</td>"),
             ("its headroom KiB", cell(fit.headroom_kib if fit else None)),
             ("SNR vs float dB (QDQ model)", cell(m.get("quant_snr_db"), fmt(m.get("quant_snr_db"), 3))),
             ("TOSA SNR vs QDQ dB", cell(m.get("tosa_snr_db"), fmt(m.get("tosa_snr_db"), 3))),
             ("TOSA max LSB", cell(m.get("tosa_max_error_lsb"))),
             ("worst node (own LSB)", f"<td>{escape(worst_node_text(m))}</td>"),
             ("top-1 float &rarr; int8", cell(acc, acc_text)), ("first bad layer", f"<td>{_first_bad_layer(b)}</td>")]
    extra = [n for n in (*glance.VS_FLOAT_SNR, *(a for a, _ in glance.VS_FLOAT_AGREEMENT), "collapsed_outputs")
             if n != "quant_snr_db" and n in m]
    pairs += [(n, cell(m[n], fmt(m[n], 3))) for n in extra]
    # against float as the report.md table words it, and the spec's evaluate: metric (verify/accuracy.py)
    pairs += [("vs float: SNR dB (QDQ) / LSB max, mean / samples", f"<td>{escape(float_text(m).replace('**', ''))}</td>"),
              ("agreement with float", f"<td>{escape(agreement_text(m))}</td>"),
              ("evaluate: deployed (QDQ, float)", f"<td>{escape(evaluate_text(m))}</td>")]
    half = (len(pairs) + 1) // 2
    rows = [[pairs[i][0], pairs[i][1], *(pairs[i + half] if i + half < len(pairs) else ("", "<td></td>"))]
            for i in range(half)]
    return '<h4>Figures</h4>' + table(["figure", "value", "figure", "value"], rows, table_id="")


def _build_details(b: dict, cache_dir: Path | None, base_dir: Path | None, uid: str = "h0",
                   regressed: bool = False, anchor: str = "", colours: dict[str, str] | None = None) -> str:
    m = b.get("metrics") or {}
    opened = " open" if b["status"] == "failed" or regressed else ""  # the ones to look at
    ident = f' id="{anchor}"' if anchor else ""
    parts = [f'<details{ident}{opened}><summary class="{status_class(b["status"])}">{escape(build_id(b))}: '
             f'{escape(b["status"])}' + (f" &mdash; {escape(failure_cause(b) or '')}" if failure_cause(b) else "")
             + "</summary>"]
    for e in b.get("errors", []):
        parts.append(f'<p class="bad">{escape(plain_message(e))}</p>')
    for w in b.get("warnings") or []:
        parts.append(f'<p class="bad">warning: {escape(w)}</p>')
    parts.append(f"<p>Artifacts: {_artifacts(b, base_dir)}</p>")
    parts.append(_figures(b))
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
        parts.append(_layer_chart(b, nodes, uid, colours))
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
    panels, rows, regressed = _delta_rows(c)
    if rows:  # the picture first; the table of every delta behind it (a tool upgrade moves hundreds)
        h.append("<h3>What moved, per metric</h3>" + deltas_svg(panels, rows, regressed))
    if c.deltas:
        h.append(f"<details{' open' if len(c.deltas) <= 12 else ''}><summary>every metric that moved "
                 f"({len(c.deltas)})</summary>" + table(["build", "metric", "old", "new", "change", "allowed",
                                                         "regression"], [
            [escape(d.build), escape(d.metric), cell(d.old), cell(d.new), escape(d.change), escape(d.limit or "-"),
             '<td class="bad">yes</td>' if d.regression else "<td>no</td>"] for d in c.deltas], sortable=True)
                 + "</details>")
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
                cache_dir: Path | None = None, history: list[dict] | None = None, base_dir: Path | None = None,
                previous: dict | None = None) -> str:
    """`history`: stored runs, oldest first (report.history); `base_dir`: where the page is written, for
    relative links to the artifacts; `previous`: the report this run replaces in its build dir, for the
    change column when there is no baseline (shown, never a regression: that is `report --baseline`'s)."""
    from npubuild.report.regress import compare

    builds = ordered(report.get("builds", []), {r.build for r in comparison.regressions} if comparison else set())
    counts = {s: sum(1 for b in builds if b["status"] == s) for s in Status}
    hosted = counts[Status.HOST_ONLY] + counts[Status.MOSTLY_HOST]
    meta = " &middot; ".join(escape(str(x)) for x in (report.get("created"), report.get("run_id"),
                                                       report.get("commit") and f"commit {report['commit']}") if x)
    if comparison is not None:
        changes, against = comparison, f"against the baseline {baseline or ''}".strip()
    elif previous is not None:
        changes = compare(report, previous, {})  # what moved, by each metric's direction; no thresholds here
        against = f"against the previous run in this build dir ({previous.get('created') or previous.get('run_id')})"
    else:
        changes, against = None, ""
    summary = (f'{len(builds)} builds: {counts[Status.PASSED] + hosted} passed'
               + (f' (<span class="bad">{hosted} wholly or mostly on the host</span>)' if hosted else "")
               + f', <span class="{"bad" if counts[Status.FAILED] else ""}">'
               f'{counts[Status.FAILED]} failed</span>, {counts[Status.SKIPPED]} skipped'
               + (f', <span class="bad">{len(comparison.regressions)} regression(s)</span>' if comparison and
                  comparison.regressions else "") + ".")
    sections = [("baseline", "baseline") if comparison is not None else None,
                ("history", "history") if history and len(history) > 1 else None,
                ("fit", "memory fit"), ("placement", "placement"), ("details", "details per build")]
    nav = " &middot; ".join(f'<a href="#{a}">{t}</a>' for a, t in filter(None, sections))
    h = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>npubuild report</title>",
         f"<style>{CSS}</style><script>{SCRIPT}</script></head><body>",
         f'<header><h1>npubuild report</h1> <span>{summary}</span>'
         + (f' <span class="muted">{meta}</span>' if meta else "") + f' <span class="muted">&middot; {nav}</span></header>']
    h.append(_main_table(builds, changes, against))
    if comparison is not None:
        h += _baseline_section(report, comparison, baseline, cache_dir)
    h += _history_section(history or [], cache_dir)
    h += _fit_section(builds)
    h += _placement_section(builds)
    h.append('<h2 id="details">Details per build</h2>')
    regressed = {r.build for r in comparison.regressions} if comparison else set()
    colours = op_colours(builds)
    h += [_build_details(b, cache_dir, base_dir, f"stripes{i}", build_id(b) in regressed, _anchor(i), colours)
          for i, b in enumerate(builds)]
    h.append("<h2>Tool versions</h2>" + table(["tool", "version"], [
        [escape(k), escape(str(v))] for k, v in report.get("versions", {}).items()]))
    h.append("</body></html>")
    return "\n".join(h) + "\n"


ABSOLUTE_UNITS = {"_lsb": "LSB change", "_ops": "change", "transposes": "change", "npu_partitions": "change",
                  "host_ops": "change"}


def _delta_unit(metric: str, deltas: list) -> str:
    """A panel's unit: dB for a `_db` metric, points for the NPU share, the metric's own for counts and LSBs,
    else percent of the old value (its own unit where an old value was 0: a percent of 0 would be no bar)."""
    if metric.endswith("_db"):
        return "dB change"
    if metric == "npu_offload":
        return "points"
    for suffix, unit in ABSOLUTE_UNITS.items():
        if metric.endswith(suffix):
            return unit
    return "change" if any(not d.old for d in deltas) else "% change"


def _delta_rows(c: Comparison) -> tuple[list[tuple[str, str, str | None]], list[tuple[str, list[float | None]]],
                                         set[tuple[str, str]]]:
    """The delta chart's panels (every metric that moved for some build, the regressed ones first: a metric
    that regressed is always drawn), its rows (per build that moved, each panel's change in the panel's unit)
    and the regressed (build, metric)s."""
    numeric = [d for d in c.deltas if isinstance(d.old, (int, float)) and isinstance(d.new, (int, float))]
    by_metric: dict[str, list] = {}
    for d in numeric:
        by_metric.setdefault(d.metric, []).append(d)
    unit = {m: _delta_unit(m, ds) for m, ds in by_metric.items()}
    vals: dict[str, dict[str, float]] = {}
    for d in numeric:
        u = unit[d.metric]
        v = (d.new - d.old) * (100 if u == "points" else 1) if u != "% change" else (d.new - d.old) / abs(d.old) * 100
        vals.setdefault(d.build, {})[d.metric] = round(v, 4)
    regressed = {(r.build, r.metric) for r in c.regressions if r.metric != "status"}
    order = {m: i for i, m in enumerate(glance.CHANGE_METRICS)}
    metrics = sorted(by_metric, key=lambda m: (not any(r[1] == m for r in regressed), order.get(m, len(order)), m))
    panels = [(m, unit[m], better_direction(m)) for m in metrics]
    return panels, [(bid, [row.get(m) for m in metrics]) for bid, row in vals.items()], regressed


def write_html(path: Path, report: dict, comparison: Comparison | None = None, baseline: str | None = None,
               cache_dir: Path | None = None, history: list[dict] | None = None, previous: dict | None = None) -> None:
    write_text(path, render_html(report, comparison, baseline, cache_dir, history, path.parent.resolve(), previous))
