"""Report plots: the page-level charts of baselines and history drawn with matplotlib (Agg, no display) as
PNG bytes cached by the data they show, and the charts every report has (memory per pool, cycles per ONNX
node per build) written as inline SVG.

The cache matters for no-op rebuilds: the same data gives the same picture,
so a rebuild that changed nothing neither imports matplotlib nor draws.
Sizes are for reading on a laptop screen: labels at 9 pt, 96 dpi, one bar per
label row (the bars sit on their tick), op types and pools in distinct colours.
The per-build chart is SVG because every build has one: matplotlib took 0.5-1 s a chart (27.6 s cold
for the 27 example builds, with 2 cores shared), SVG text costs nothing and stays sharp when zoomed.
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path

from npubuild.fileio import stable_hash, write_bytes

FONT = 9
DPI = 96
STYLE = 2  # part of each cached plot's key: bump it when a chart's drawing changes
PALETTE = ("#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c", "#dc7ec0", "#797979", "#d5bb67",
           "#82c6e2")
POOL_COLOURS = {"sram": "#4878d0", "dram": "#ee854a", "on_chip_flash": "#6acc64", "off_chip_flash": "#956cb4"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": FONT, "axes.titlesize": FONT + 2, "axes.labelsize": FONT,
                         "xtick.labelsize": FONT, "ytick.labelsize": FONT, "legend.fontsize": FONT})
    return plt


def _png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def _height(rows: int) -> float:
    return min(1.2 + 0.26 * rows, 60.0)


def colour_of(names: list[str]) -> dict[str, str]:
    """A stable colour per name (op type): the same op type has the same colour in every chart of a page."""
    return {n: PALETTE[int(stable_hash(n, 8), 16) % len(PALETTE)] for n in sorted(set(names))}


def pools_svg(rows: list[tuple[str, list[dict]]]) -> str:
    """One bar per build and pool as an inline SVG: percent of the pool used (100% = the line; red: does not
    fit), labelled `used / size KiB`. SVG, not matplotlib: drawing it was 1.5-2.7 s of a cold one-build
    compile (importing pyplot most of it), more than the lower stage of a small model."""
    row, label_w, bar_w, top = 17, 300, 400, 44
    bars = []
    for bid, pools in rows:
        for p in pools:
            size = p.get("size_kib") or 0
            colour = "#d62728" if not p.get("fits", True) else POOL_COLOURS.get(p.get("kind"), "#797979")
            bars.append((f"{bid}  {p['pool']}", 100 * p["used_kib"] / size if size else 0.0, colour,
                         f"{p['used_kib']:.1f} / {size:g} KiB"))
    scale = max(130.0, max((b[1] for b in bars), default=0.0) + 30)  # percent at the right edge
    width = label_w + bar_w + 130
    parts = [f'<svg role="img" aria-label="memory use per pool" width="{width}" '
             f'height="{top + row * len(bars) + 26}" font-family="system-ui,sans-serif" font-size="12">',
             '<text x="0" y="14" font-size="13" font-weight="bold">Memory use per pool</text>']
    x = 0
    for kind, colour in POOL_COLOURS.items():  # the legend: one swatch per pool kind
        parts.append(f'<rect x="{x}" y="22" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="31">{escape(kind)}</text>')
        x += 34 + 7 * len(kind)
    for i, (label, pct, colour, text) in enumerate(bars):
        y = top + i * row
        w = bar_w * min(pct, scale) / scale
        parts.append(f'<g><title>{escape(f"{label}: {pct:.1f}% ({text})")}</title>'
                     f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{escape(label)}</text>'
                     f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 4}" fill="{colour}"/>'
                     f'<text x="{label_w + w + 4:.1f}" y="{y + 12}" fill="#555">'
                     f'{escape(text)}</text></g>')
    full = label_w + bar_w * 100 / scale
    axis_y = top + row * len(bars) + 16
    parts.append(f'<line x1="{full:.1f}" y1="{top - 2}" x2="{full:.1f}" y2="{axis_y - 12}" stroke="black"/>'
                 f'<text x="{label_w}" y="{axis_y}" fill="#555">% of the pool used (the line: 100%; red: does '
                 f'not fit)</text></svg>')
    return "".join(parts)


def layers_svg(title: str, layers: list[tuple[str, float, str, bool]], uid: str) -> str:
    """Cycles per ONNX node as an inline SVG: one bar per node in execution order, coloured by op type
    (legend on top), striped when memory-bound; each bar's tooltip gives its node, op, cycles and bound.

    `layers`: (label, cycles, op type, memory-bound); `uid`: unique in the page (the stripe pattern's id)."""
    colours = colour_of([op for _, _, op, _ in layers])
    row, label_w, bar_w, top = 17, 230, 470, 44
    width = label_w + bar_w + 90
    most = max((c for _, c, _, _ in layers), default=0) or 1
    parts = [f'<svg role="img" aria-label="cycles per ONNX node" '
             f'width="{width}" height="{top + row * len(layers) + 26}" font-family="system-ui,sans-serif" '
             f'font-size="12">',
             f'<defs><pattern id="{uid}" width="6" height="6" patternUnits="userSpaceOnUse" '
             f'patternTransform="rotate(45)"><rect width="2.5" height="6" fill="white" opacity="0.55"/></pattern></defs>',
             f'<text x="0" y="14" font-size="13" font-weight="bold">{escape(title)}</text>']
    x = 0
    for op, colour in colours.items():  # the legend: one swatch per op type
        parts.append(f'<rect x="{x}" y="22" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="31">{escape(op)}</text>')
        x += 34 + 7 * len(op)
    parts.append(f'<rect x="{x}" y="22" width="10" height="10" fill="#888"/><rect x="{x}" y="22" width="10" '
                 f'height="10" fill="url(#{uid})"/><text x="{x + 14}" y="31">memory-bound</text>')
    for i, (name, cycles, op, memory) in enumerate(layers):
        y = top + i * row
        w = max(1.0, bar_w * cycles / most)
        tip = escape(f"{name}: {op}, {cycles:,.0f} cycles, {'memory' if memory else 'compute'}-bound")
        parts.append(f'<g><title>{tip}</title>'
                     f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">{escape(name)}</text>'
                     f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 4}" fill="{colours[op]}"/>'
                     + (f'<rect x="{label_w}" y="{y + 2}" width="{w:.1f}" height="{row - 4}" fill="url(#{uid})"/>'
                        if memory else "")
                     + f'<text x="{label_w + w + 4:.1f}" y="{y + 12}" fill="#555">{cycles:,.0f}</text></g>')
    axis_y = top + row * len(layers) + 16
    parts.append(f'<text x="{label_w}" y="{axis_y}" fill="#555">cycles per ONNX node (Vela\'s estimate), '
                 f'in execution order</text></svg>')
    return "".join(parts)


def trend_chart(metrics: list[str], rows: list[tuple[str, list[float | None]]]) -> bytes:
    """Percent change of each metric against the baseline: one panel per metric, one bar per build."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), _height(len(rows))), sharey=True,
                             squeeze=False)
    ys = list(range(len(rows)))
    for j, (ax, metric) in enumerate(zip(axes[0], metrics, strict=True)):
        vals = [vals[j] if vals[j] is not None else 0.0 for _, vals in rows]
        ax.barh(ys, vals, color=["#d65f5f" if v > 0 else "#6acc64" for v in vals], height=0.7)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title(metric)
        ax.set_xlabel("% change")
    axes[0][0].set_yticks(ys, [r[0] for r in rows])
    axes[0][0].set_ylim(len(rows) - 0.5, -0.5)
    fig.suptitle("Against the baseline (positive = larger)", fontsize=FONT + 2)
    return _png(fig)


def history_chart(metric: str, runs: list[str], series: list[tuple[str, list[float | None]]]) -> bytes:
    """One metric over the stored runs, a line per build: builds whose value moved in colour and named,
    the steady ones in grey."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    xs = list(range(len(runs)))
    from npubuild.report.history import moved as changed

    moved = [(bid, vals) for bid, vals in series if changed(vals)]
    steady = [(bid, vals) for bid, vals in series if (bid, vals) not in moved]
    for _, vals in steady:
        ax.plot(xs, vals, color="#c8c8c8", linewidth=1, marker=".")
    cmap = plt.get_cmap("tab20")
    for i, (bid, vals) in enumerate(moved[:20]):
        ax.plot(xs, vals, color=cmap(i % 20), linewidth=1.8, marker="o", label=bid)
    if len(moved) > 20:
        ax.plot([], [], color="white", label=f"+{len(moved) - 20} more (see the table)")
    ax.set_xticks(xs, runs, rotation=30, ha="right")
    ax.set_title(f"{metric} per run ({len(moved)} build(s) changed, {len(steady)} steady in grey)")
    ax.grid(axis="y", color="#eeeeee")
    if moved:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


DRAW = {"trend": trend_chart, "history": history_chart}


def cached_png(cache_dir: Path | None, kind: str, args: tuple) -> bytes:
    """`kind`'s chart for `args`, from the cache when the same data was drawn before."""
    draw = DRAW[kind]
    if cache_dir is None:
        return draw(*args)
    path = cache_dir / f"{kind}-{stable_hash([kind, args, FONT, DPI, STYLE], 16)}.png"
    if path.is_file():
        os.utime(path)  # in use: `npubuild clean --stale` keeps plots no older than the last report
        return path.read_bytes()
    data = draw(*args)
    write_bytes(path, data)
    return data
