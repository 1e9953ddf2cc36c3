"""report.html read the way a browser does (html.parser): its tables by id as rows of cells, and its inline SVG
charts with their legends and bars, so tests assert what a reader sees rather than substrings of markup."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Cell:
    text: str
    attrs: dict[str, str]


@dataclass
class Row:
    attrs: dict[str, str]
    cells: list[Cell] = field(default_factory=list)

    def texts(self) -> list[str]:
        return [c.text for c in self.cells]


@dataclass
class Svg:
    attrs: dict[str, str]
    rects: list[dict[str, str]] = field(default_factory=list)
    texts: list[tuple[dict[str, str], str]] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)


class Page(HTMLParser):
    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, tuple[list[str], list[Row]]] = {}
        self.svgs: list[Svg] = []
        self._table: str | None = None
        self._head: list[str] = []
        self._rows: list[Row] = []
        self._row: Row | None = None
        self._cell: Cell | None = None
        self._th: list[str] | None = None
        self._depth = 0
        self._svg: Svg | None = None
        self._svg_text: tuple[dict[str, str], list[str]] | None = None
        self._title: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "table":
            self._depth += 1
            if self._depth == 1:
                self._table, self._head, self._rows = a.get("id", f"table{len(self.tables)}"), [], []
        elif tag == "tr" and self._depth == 1:
            self._row = Row(a)
        elif tag == "th" and self._depth == 1:
            self._th = []
        elif tag == "td" and self._depth == 1 and self._row is not None:
            self._cell = Cell("", a)
        elif tag == "svg":
            self._svg = Svg(a)
            self.svgs.append(self._svg)
        elif self._svg is not None and tag == "rect":
            self._svg.rects.append(a)
        elif self._svg is not None and tag == "text":
            self._svg_text = (a, [])
        elif self._svg is not None and tag == "title":
            self._title = []

    def handle_endtag(self, tag):
        if tag == "table":
            if self._depth == 1 and self._table is not None:
                self.tables[self._table] = (self._head, self._rows)
            self._depth -= 1
        elif tag == "tr" and self._depth == 1 and self._row is not None:
            if self._row.cells:
                self._rows.append(self._row)
            self._row = None
        elif tag == "th" and self._th is not None:
            self._head.append("".join(self._th).replace("\u2195", "").strip())
            self._th = None
        elif tag == "td" and self._cell is not None and self._row is not None:
            self._cell.text = self._cell.text.strip()
            self._row.cells.append(self._cell)
            self._cell = None
        elif tag == "svg":
            self._svg = None
        elif tag == "text" and self._svg is not None and self._svg_text is not None:
            self._svg.texts.append((self._svg_text[0], "".join(self._svg_text[1])))
            self._svg_text = None
        elif tag == "title" and self._svg is not None and self._title is not None:
            self._svg.titles.append("".join(self._title))
            self._title = None

    def handle_data(self, data):
        if self._th is not None:
            self._th.append(data)
        elif self._cell is not None:
            self._cell.text += data
        if self._svg_text is not None:
            self._svg_text[1].append(data)
        if self._title is not None:
            self._title.append(data)

    def table(self, table_id: str) -> tuple[list[str], list[Row]]:
        return self.tables[table_id]

    def charts(self, label_start: str) -> list[Svg]:
        return [s for s in self.svgs if s.attrs.get("aria-label", "").startswith(label_start)]


def legend(svg: Svg) -> dict[str, str]:
    """A chart's legend: each swatch's label -> its colour (swatches are the 10x10 rects at the top)."""
    swatches = [r for r in svg.rects if r.get("width") == "10" and r.get("height") == "10"
                and not r.get("fill", "").startswith("url(")]
    labels = [t for a, t in svg.texts if a.get("y") == "31"]
    return dict(zip(labels, (r["fill"] for r in swatches), strict=False))
