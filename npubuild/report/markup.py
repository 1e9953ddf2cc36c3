"""Markup for report.html: the page's style and sort/filter script, and the table cells, meters, links and
images its sections are made of (numeric cells carry their raw value, so sorting is by number)."""

from __future__ import annotations

import base64
import os
from html import escape
from pathlib import Path

from npubuild.report.brief import num

CSS = """
body{font-family:system-ui,sans-serif;margin:10px 20px;color:#222;font-size:14px}
h2{margin-top:1.6em;border-bottom:1px solid #ddd}
header{margin:0 0 .4em}header h1{display:inline;font-size:20px;margin-right:.6em}p.toolbar{margin:.3em 0}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;vertical-align:top}
th{background:#f3f3f3;position:sticky;top:0}
th.sort{cursor:pointer;user-select:none}th.sort:after{content:" \\2195";color:#999}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.id{white-space:nowrap}td.problem{min-width:22em;max-width:34em}
#builds-table{table-layout:fixed;width:100%}#builds-table td,#builds-table th{font-size:12px;line-height:14px;padding:1px 4px}
#builds-table td{white-space:nowrap;overflow:hidden;text-overflow:ellipsis;max-width:none;min-width:0}
#builds-table th{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
#builds-table td.problem{font-weight:normal}#builds-table td.problem span.bad{font-weight:normal}
col.c-build{width:15%}col.c-target{width:7.5%}col.c-status{width:5%}col.c-fit{width:17%}col.c-ms{width:5.5%}
col.c-npu{width:4%}col.c-vs{width:9%}col.c-tosa{width:8.5%}col.c-change{width:10%}col.c-problem{width:auto}
td.warn{background:#fff1cc}td.better{color:#1a7f1a}td.worse{color:#b35900}td.change.bad{color:#a00}
td.fit.bad{color:#a00;font-weight:bold}
.passed{background:#dff0d8}.failed{background:#f2dede}.skipped{background:#fcf8e3}.host{background:#fcebd3}
tr.regressed td{background:#fff1cc}tr.regressed td:first-child{border-left:4px solid #e69500}
.bad{color:#a00;font-weight:bold}.muted{color:#777}
.meter{display:inline-block;width:50px;height:9px;background:#eee;margin-right:4px;vertical-align:middle}
.meter span{display:block;height:9px;background:#4878d0}.meter span.full{background:#d62728}
details{margin:.3em 0}summary{cursor:pointer}
img{max-width:100%}
#filter{padding:3px 6px;width:22em}
code{background:#f6f6f6;padding:0 3px}
"""
SCRIPT = """
function sortBy(th){var t=th.closest('table'),i=[...th.parentNode.children].indexOf(th),
asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';var rows=[...t.tBodies[0].rows];
rows.sort(function(a,b){var x=a.cells[i].dataset.v,y=b.cells[i].dataset.v;
if(x!==undefined&&y!==undefined&&x!==''&&y!==''){x=parseFloat(x);y=parseFloat(y)}
else{x=a.cells[i].textContent;y=b.cells[i].textContent}
return (x<y?-1:x>y?1:0)*(asc?1:-1)});rows.forEach(function(r){t.tBodies[0].appendChild(r)})}
function filterRows(){var q=document.getElementById('filter').value.toLowerCase(),
p=document.getElementById('problems').checked;
document.querySelectorAll('#builds-table tbody tr').forEach(function(r){
var show=r.textContent.toLowerCase().indexOf(q)>=0&&(!p||r.dataset.problem==='1');
r.style.display=show?'':'none'})}
function openPanel(id){var d=document.getElementById(id);if(d){d.open=true}}
window.addEventListener('load',function(){if(location.hash)openPanel(location.hash.slice(1))});
"""

def fmt(v, digits: int = 4) -> str:
    """A figure escaped for the page, as brief.num writes it."""
    return escape(num(v, digits))


def img(png: bytes, alt: str) -> str:
    """A PNG embedded in the page (no file next to it to lose)."""
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def cell(value, text: str | None = None, numeric: bool = True, cls: str = "") -> str:
    """A table cell; numeric cells carry their raw value for sorting."""
    shown = fmt(value) if text is None else text
    sort = f' data-v="{value}"' if numeric and isinstance(value, (int, float)) and not isinstance(value, bool) else (
        ' data-v=""' if numeric else "")
    classes = " ".join(c for c in ("n" if numeric else "", cls) if c)
    attr = f' class="{classes}"' if classes else ""
    return f"<td{attr}{sort}>{shown}</td>"


def table(head: list[str], rows: list[list[str]], table_id: str = "", sortable: bool = False) -> str:
    """`rows` are lists of ready <td> cells (use _cell) or HTML strings (already escaped, left-aligned)."""
    ths = "".join(f'<th class="sort" onclick="sortBy(this)">{escape(h)}</th>' if sortable else f"<th>{escape(h)}</th>"
                  for h in head)
    body = []
    for r in rows:
        cells = [c if c.startswith("<td") else f"<td>{c}</td>" for c in r]
        body.append("<tr>" + "".join(cells) + "</tr>")
    tid = f' id="{table_id}"' if table_id else ""
    return f"<table{tid}><thead><tr>{ths}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"


def meter(frac: float | None, full: bool) -> str:
    """A small bar: the fraction of a pool used (red when it does not fit)."""
    if frac is None:
        return ""
    width = max(0, min(100, round(frac * 100)))
    return f'<span class="meter"><span class="{"full" if full else ""}" style="width:{width}%"></span></span>'


def link(path: str | None, label: str, base_dir: Path | None) -> str:
    """A link to a build artifact, relative to the page so the build dir can move or be served."""
    if not path:
        return ""
    href = path
    if base_dir is not None:
        try:
            href = os.path.relpath(path, base_dir)
        except ValueError:
            pass
    return f'<a href="{escape(Path(href).as_posix())}">{escape(label)}</a>'
