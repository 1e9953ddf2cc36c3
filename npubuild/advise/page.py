"""`npubuild advise`'s answer as people read it: a text table, a chart (PNG) and a page (HTML, the chart and
the table in one file). The same figures are in report.json's `advice` for scripts (advise.Advice.as_json).
"""

from __future__ import annotations

from html import escape

from npubuild.advise import Advice, Point
from npubuild.report.glance import kib, milliseconds

GENERATION_COLOURS = {"u55": "#4878d0", "u65": "#ee854a", "u85": "#6acc64"}


def _energy(p: Point, least: float | None) -> str:
    return f"{p.energy_proxy / least:.2f}x" if p.energy_proxy and least else "-"


def _row(p: Point, least: float | None) -> list[str]:
    if not p.fits:
        return [p.config, f"{p.macs_per_cycle}", kib(p.sram_kib), "-", "-", "-", "-", "-", "-",
                ("does not fit: " if p.misfit else "failed: ") + (p.cause or "")]
    return [p.config, f"{p.macs_per_cycle}", kib(p.sram_kib), milliseconds(p.inference_ms or 0),
            f"{p.inferences_per_s:,.0f}" if p.inferences_per_s else "-",
            kib(p.sram_used_kib) if p.sram_used_kib is not None else "-",
            kib(p.offchip_kib) if p.offchip_kib is not None else "-", _energy(p, least),
            f"{p.efficiency:.0%}" if p.efficiency is not None else "-",
            ", ".join(x for x in ("pareto" if p.pareto else "", "meets budget" if p.meets_budget else "") if x)]


HEAD = ["configuration", "MACs", "SRAM KiB", "ms", "inf/s", "SRAM used", "off-chip KiB", "energy", "MAC util",
        "notes"]


def _same(p: Point, q: Point) -> bool:
    """Two sizes of one profile that change nothing (the model fits either way, at the same figures)."""
    return (p.profile == q.profile and p.fits == q.fits and p.inference_ms == q.inference_ms and p.pareto == q.pareto
            and p.meets_budget == q.meets_budget and p.sram_used_kib == q.sram_used_kib and p.cause == q.cause)


def text_table(a: Advice) -> str:
    """The table `advise` prints: a configuration per line, smallest first, SRAM sizes of one profile that
    change nothing on one line (`128-2048`; advice.html and report.json have each); the choice and the
    Pareto front marked."""
    least = min((p.energy_proxy for p in a.points if p.energy_proxy), default=None)
    groups: list[list[Point]] = []
    for p in sorted(a.points, key=lambda p: (p.macs_per_cycle, p.generation, p.profile, p.sram_kib)):
        if groups and _same(groups[-1][-1], p) and a.chosen not in (p, groups[-1][-1]):
            groups[-1].append(p)
        else:
            groups.append([p])
    rows = []
    for g in groups:
        r = _row(g[0], least)
        if len(g) > 1:
            r[0] = g[0].profile
            r[2] = f"{kib(g[0].sram_kib)}-{kib(g[-1].sram_kib)}"
        if a.chosen is g[0]:
            r[-1] = ", ".join(x for x in (r[-1], "<< SMALLEST WITHIN BUDGET") if x)
        rows.append([*r[:1], f"{g[0].clock_mhz:g}", *r[1:]])
    head = [HEAD[0], "MHz", *HEAD[1:]]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head[:-1])]
    numeric = set(range(1, len(head) - 1))

    def line(cells: list[str]) -> str:
        out = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells[:-1], widths,
                                                                                          strict=True))]
        return ("  ".join(out) + "  " + cells[-1]).rstrip()

    lines = [line(head), *(line(r) for r in rows)]
    lines.append("")
    lines.append("energy: NPU cycles x MACs per cycle, relative to the least; MAC util: the model's MACs over "
                 "cycles x MACs per cycle; SRAM KiB: the SRAM pool's size (U55: the arena's; U65/U85: the NPU's "
                 "cache before DRAM); Pareto: no other configuration is faster with no more MACs and SRAM")
    lines.append(verdict(a))
    return "\n".join(lines)


def verdict(a: Advice) -> str:
    """One line: the smallest configuration within the budget, or why there is none."""
    fit = [p for p in a.points if p.fits]
    front = ", ".join(p.config for p in a.points if p.pareto)
    if not fit:
        return f"{a.model}: no configuration could hold it ({a.points[0].cause if a.points else 'nothing built'})"
    fastest = min(fit, key=lambda p: p.inference_ms or float("inf"))
    if a.budget_ms is None:
        return (f"{a.model}: fastest {fastest.config} at {milliseconds(fastest.inference_ms or 0)} ms; Pareto front "
                f"(time, MACs, SRAM): {front} (--latency-ms or --fps picks the smallest within a budget)")
    if a.chosen is None:
        return (f"{a.model}: no configuration meets {milliseconds(a.budget_ms)} ms; the fastest, {fastest.config}, "
                f"takes {milliseconds(fastest.inference_ms or 0)} ms")
    c = a.chosen
    return (f"{a.model}: smallest configuration within {milliseconds(a.budget_ms)} ms: {c.config} "
            f"({c.macs_per_cycle} MACs, {kib(c.sram_kib)} KiB SRAM) at {milliseconds(c.inference_ms or 0)} ms "
            f"({c.inferences_per_s:,.0f}/s)")


def chart_png(a: Advice, cache_dir=None) -> bytes:
    """The chart, from the plot cache when the same figures were drawn before (a cached rerun draws nothing:
    importing and running matplotlib is most of its time)."""
    from npubuild.report.plots import cached_png

    return cached_png(cache_dir, "advice", (a.as_json(),), draw_chart)


def draw_chart(data: dict) -> bytes:
    """Time against MAC array size for every configuration that fits (log scales): colour by generation, size
    by SRAM, the Pareto front joined, the budget a line, the choice ringed; beside it, energy proxy against
    time. `data`: Advice.as_json()."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from npubuild.report.plots import _png, _pyplot

    plt = _pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    fit = [p for p in data["configurations"] if p["fits"] and p["inference_ms"]]
    sizes = sorted({p["sram_kib"] for p in fit}) or [1.0]
    for gen, colour in GENERATION_COLOURS.items():
        pts = [p for p in fit if p["generation"] == gen]
        if not pts:
            continue
        area = [20 + 100 * sizes.index(p["sram_kib"]) / max(1, len(sizes) - 1) for p in pts]
        ax.scatter([p["macs_per_cycle"] for p in pts], [p["inference_ms"] for p in pts], s=area, c=colour, alpha=0.7,
                   label=f"Ethos-{gen.upper()}", edgecolors="white", linewidths=0.5)
        ax2.scatter([p["inference_ms"] for p in pts], [p["energy_proxy"] for p in pts], s=area, c=colour, alpha=0.7,
                    edgecolors="white", linewidths=0.5)
    front = sorted((p for p in fit if p["pareto"]), key=lambda p: (p["macs_per_cycle"], p["inference_ms"]))
    if front:
        ax.plot([p["macs_per_cycle"] for p in front], [p["inference_ms"] for p in front], color="#444", linewidth=1,
                linestyle="--", label="Pareto front (time, MACs, SRAM)")
    if data["budget_ms"] is not None:
        ax.axhline(data["budget_ms"], color="#d62728", linewidth=1, label=f"budget {milliseconds(data['budget_ms'])} ms")
        ax2.axvline(data["budget_ms"], color="#d62728", linewidth=1)
    chosen = next((p for p in data["configurations"] if p["config"] == data["chosen"]), None)
    if chosen is not None:
        ax.scatter([chosen["macs_per_cycle"]], [chosen["inference_ms"]], s=280, facecolors="none", edgecolors="black",
                   linewidths=1.8, label=f"smallest within budget: {chosen['config']}")
        ax2.scatter([chosen["inference_ms"]], [chosen["energy_proxy"]], s=280, facecolors="none", edgecolors="black",
                    linewidths=1.8)
    ax.set_xscale("log", base=2)
    for a in (ax, ax2):
        a.set_yscale("log")
    ax2.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis, ax2.xaxis):  # 0.05, 0.1, 0.2 rather than 5 x 10^-2
        if axis is not ax.xaxis:
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("MACs per cycle")
    ax.set_ylabel("inference time, ms (Vela's estimate)")
    ax.set_title(f"{data['model']}: time per configuration (marker size: SRAM)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(color="#eeeeee", which="both")
    ax2.set_xlabel("inference time, ms")
    ax2.set_ylabel("energy proxy: NPU cycles x MACs per cycle")
    ax2.set_title("energy proxy against time (lower left is better)")
    ax2.grid(color="#eeeeee", which="both")
    fig.tight_layout()
    return _png(fig)


def html_page(a: Advice, png: bytes) -> str:
    """The chart and the table in one self-contained page."""
    import base64

    from npubuild.report.markup import CSS

    least = min((p.energy_proxy for p in a.points if p.energy_proxy), default=None)
    rows = []
    for p in a.points:
        r = _row(p, least)
        cls = "chosen" if a.chosen is p else ("failed" if not p.fits else "pareto" if p.pareto else "")
        cells = "".join((f'<td class="n">{escape(v)}</td>' if 0 < i < 9 else f"<td>{escape(v)}</td>")
                        for i, v in enumerate(r))
        rows.append(f'<tr class="{cls}">{cells}</tr>')
    head = "".join(f"<th>{escape(h)}</th>" for h in HEAD)
    style = CSS + "tr.chosen td{background:#dff0d8;font-weight:bold}tr.pareto td:first-child{border-left:4px solid #444}"
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>npubuild advise: "
            f"{escape(a.model)}</title><style>{style}</style></head><body>"
            f"<h1>Which Ethos-U does {escape(a.model)} need?</h1><p><b>{escape(verdict(a))}</b></p>"
            f'<img alt="time and energy per configuration" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
            f"<table id=\"advice\"><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
            "<p class=\"muted\">energy: NPU cycles x MACs per cycle, relative to the least; MAC util: the model's "
            "MACs over cycles x MACs per cycle; SRAM KiB: the SRAM pool's size (U55: the arena's; U65/U85: the "
            "NPU's cache before DRAM); Pareto front (left border): no other configuration is faster with no more "
            "MACs and SRAM. Every figure is Vela's estimate for the profile's clock and memories.</p>"
            "</body></html>\n")
