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
from collections.abc import Callable
from html import escape
from pathlib import Path

from npubuild.fileio import stable_hash, write_bytes

FONT = 9
DPI = 96
STYLE = 3  # part of each cached plot's key: bump it when a chart's drawing changes
# 20 colours told apart at a glance (matplotlib's tab10 then its light pairs, reordered so neighbours differ)
PALETTE = ("#4878d0", "#ee854a", "#6acc64", "#d65f5f", "#956cb4", "#8c613c", "#dc7ec0", "#797979", "#d5bb67",
           "#82c6e2", "#1f3f8f", "#a8dd8f", "#b30000", "#f5b971", "#4b2d7f", "#c49c94", "#005f5f", "#c7c7c7",
           "#7f7f00", "#ff9896")
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


def colour_of(names: list[str], preferred: dict[str, str] | None = None) -> dict[str, str]:
    """A distinct colour per name (op type) within one chart. `preferred` (the page's op types, most cycles
    first, given the palette in turn: page_colours) keeps an op type's colour the same across the page's
    charts where that leaves the chart's colours distinct; a name it has none for, or whose colour another
    name of this chart already has, takes the first palette colour unused in this chart (then shades)."""
    preferred = preferred or {}
    out: dict[str, str] = {}
    for n in sorted(set(names), key=lambda n: (n not in preferred, list(preferred).index(n) if n in preferred else 0, n)):
        want = preferred.get(n)
        if want is None or want in out.values():
            want = next((c for c in PALETTE if c not in out.values()), None) or _shade(len(out))
        out[n] = want
    return dict(sorted(out.items()))


def page_colours(names_by_weight: list[str]) -> dict[str, str]:
    """The page's op types, heaviest first, each given the next palette colour (then shades)."""
    return {n: PALETTE[i] if i < len(PALETTE) else _shade(i) for i, n in enumerate(dict.fromkeys(names_by_weight))}


def _shade(i: int) -> str:
    """Colours past the palette: hues around the circle by the golden angle, never repeating."""
    import colorsys

    r, g, b = colorsys.hls_to_rgb((i * 0.381966) % 1.0, 0.45 + 0.15 * (i % 3) / 2, 0.6)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


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


def layers_svg(title: str, layers: list[tuple[str, float, str, bool]], uid: str,
               preferred: dict[str, str] | None = None) -> str:
    """Cycles per ONNX node as an inline SVG: one bar per node in execution order, coloured by op type
    (legend on top), striped when memory-bound; each bar's tooltip gives its node, op, cycles and bound.

    `layers`: (label, cycles, op type, memory-bound); `uid`: unique in the page (the stripe pattern's id)."""
    colours = colour_of([op for _, _, op, _ in layers], preferred)
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


BETTER, WORSE, NEUTRAL = "#2ca02c", "#d62728", "#8c8c8c"


def deltas_svg(panels: list[tuple[str, str, str | None]], rows: list[tuple[str, list[float | None]]],
               regressed: set[tuple[str, str]], width: int = 1340) -> str:
    """The change of each metric against the baseline as inline SVG: one panel per metric (its unit and which
    way is better in its own title, no figure title over them), one bar per build, green where the metric got
    better and red where worse by its direction (grey: no direction), a regression past its threshold
    outlined black. Panels wrap to `width`, each row of panels with the build labels again.

    `panels`: (metric, unit, 'lower'/'higher'/None); `rows`: (build, the change per panel or None);
    `regressed`: the (build, metric) pairs that are regressions."""
    label_w = min(440, 12 + 7 * max((len(bid) for bid, _ in rows), default=10))  # the build ids whole
    panel_w, gap, row, top = 190, 14, 17, 34
    per_row = max(1, (width - label_w) // (panel_w + gap))
    out = []
    for first in range(0, len(panels), per_row):
        chunk = list(enumerate(panels))[first:first + per_row]
        height = top + row * len(rows) + 8
        parts = [f'<svg role="img" aria-label="change against the baseline: '
                 f'{escape(", ".join(p[0] for _, p in chunk))}" width="{label_w + len(chunk) * (panel_w + gap)}" '
                 f'height="{height}" font-family="system-ui,sans-serif" font-size="12">']
        for i, (bid, _) in enumerate(rows):
            parts.append(f'<text x="{label_w - 6}" y="{top + i * row + 12}" text-anchor="end">{escape(bid)}</text>')
        for k, (j, (metric, unit, direction)) in enumerate(chunk):
            x0 = label_w + k * (panel_w + gap)
            vals = [r[1][j] for r in rows]
            most = max((abs(v) for v in vals if v is not None), default=0.0) or 1.0
            mid = x0 + panel_w / 2
            hint = {"lower": "lower is better", "higher": "higher is better"}.get(direction or "", "")
            parts.append(f'<text x="{x0}" y="12" font-weight="bold">{escape(metric)}</text>'
                         f'<text x="{x0}" y="26" fill="#555">{escape(unit)}{", " + hint if hint else ""}</text>'
                         f'<line x1="{mid}" y1="{top - 2}" x2="{mid}" y2="{top + row * len(rows)}" stroke="black"/>')
            for i, v in enumerate(vals):
                if v is None:
                    continue
                y = top + i * row
                w = (panel_w / 2 - 34) * abs(v) / most
                worse = direction is not None and ((v > 0) == (direction == "lower"))
                colour = NEUTRAL if direction is None or v == 0 else WORSE if worse else BETTER
                bad = (rows[i][0], metric) in regressed
                x = mid if v >= 0 else mid - w
                text_x = mid + w + 3 if v >= 0 else mid - w - 3
                parts.append(f'<g><title>{escape(f"{rows[i][0]}: {metric} {v:+.4g} {unit}")}'
                             f'{" (regression)" if bad else ""}</title>'
                             f'<rect x="{x:.1f}" y="{y + 2}" width="{max(w, 1):.1f}" height="{row - 4}" fill="{colour}"'
                             + (' stroke="black" stroke-width="1.5"' if bad else "") + "/>"
                             f'<text x="{text_x:.1f}" y="{y + 12}" fill="#333" '
                             f'text-anchor="{"start" if v >= 0 else "end"}">{v:+.3g}</text></g>')
        parts.append("</svg>")
        out.append("".join(parts))
    return "<br>".join(out)


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


DRAW = {"history": history_chart}


def cached_png(cache_dir: Path | None, kind: str, args: tuple, draw: Callable[..., bytes] | None = None) -> bytes:
    """`kind`'s chart for `args` (drawn by `draw`, else DRAW's), from the cache when the same data was drawn
    before."""
    draw = draw or DRAW[kind]
    if cache_dir is None:
        return draw(*args)
    path = cache_dir / f"{kind}-{stable_hash([kind, args, FONT, DPI, STYLE], 16)}.png"
    if path.is_file():
        os.utime(path)  # in use: `npubuild clean --stale` keeps plots no older than the last report
        return path.read_bytes()
    data = draw(*args)
    write_bytes(path, data)
    return data
