"""Report plots drawn with matplotlib (Agg, no display), as PNG bytes cached by the data they show.

The cache matters for no-op rebuilds: the same data gives the same picture,
so a rebuild that changed nothing neither imports matplotlib nor draws.
"""

from __future__ import annotations

import os
from pathlib import Path

from npubuild.fileio import stable_hash, write_bytes


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def _height(n: int) -> float:
    return min(2.0 + 0.28 * n, 40.0)


def pools_chart(rows: list[tuple[str, list[dict]]]) -> bytes:
    """Horizontal bars: per build, KiB used in each memory pool (labelled with the pool's size)."""
    plt = _pyplot()
    names = sorted({p["pool"] for _, pools in rows for p in pools})
    fig, ax = plt.subplots(figsize=(8, _height(len(rows) * max(1, len(names)) / 2)))
    h = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        ys, xs = [], []
        for i, (_, pools) in enumerate(rows):
            for p in pools:
                if p["pool"] == name:
                    ys.append(i + j * h)
                    xs.append(p["used_kib"])
        ax.barh(ys, xs, height=h, label=name)
    ax.set_yticks([i + h * (len(names) - 1) / 2 for i in range(len(rows))], [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("KiB used")
    ax.set_title("Memory use per pool")
    ax.legend(fontsize=7)
    return _png(fig)


def layers_chart(title: str, layers: list[tuple[str, float]]) -> bytes:
    """Horizontal bars: cycles per layer, in execution order."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, _height(len(layers))))
    ax.barh(range(len(layers)), [c for _, c in layers])
    ax.set_yticks(range(len(layers)), [n for n, _ in layers], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("cycles")
    ax.set_title(title)
    return _png(fig)


def trend_chart(metrics: list[str], rows: list[tuple[str, list[float | None]]]) -> bytes:
    """Grouped horizontal bars: per build, percent change of each metric against the baseline."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, _height(len(rows) * len(metrics) / 2)))
    h = 0.8 / max(1, len(metrics))
    for j, m in enumerate(metrics):
        ys = [i + j * h for i, (_, vals) in enumerate(rows) if vals[j] is not None]
        xs = [vals[j] for _, vals in rows if vals[j] is not None]
        ax.barh(ys, xs, height=h, label=m)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks([i + h * (len(metrics) - 1) / 2 for i in range(len(rows))], [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("% change against the baseline (positive = larger)")
    ax.set_title("Metric trend against the baseline")
    ax.legend(fontsize=7)
    return _png(fig)


def cached_png(cache_dir: Path | None, kind: str, args: tuple) -> bytes:
    """`kind`'s chart for `args`, from the cache when the same data was drawn before."""
    draw = {"pools": pools_chart, "layers": layers_chart, "trend": trend_chart}[kind]
    if cache_dir is None:
        return draw(*args)
    path = cache_dir / f"{kind}-{stable_hash([kind, args], 16)}.png"
    if path.is_file():
        os.utime(path)  # in use: `npubuild clean --stale` keeps plots no older than the last report
        return path.read_bytes()
    data = draw(*args)
    write_bytes(path, data)
    return data
