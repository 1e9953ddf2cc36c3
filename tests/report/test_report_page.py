"""report.html read as a page (tests/report/htmlpage.py parses it): what a reader sees in its charts and tables.

Synthetic report entries, built in memory: the page is a pure function of report.json, and these are the cases
a nightly of real builds meets (many op types in one model, a metric that regressed while another improved).
"""

from __future__ import annotations

from npbtest.htmlpage import Page, legend

from npubuild.report.html import render_html
from npubuild.report.plots import BETTER, WORSE
from npubuild.report.regress import DEFAULTS, compare

OPS = ("Conv", "MaxPool", "Gelu", "MatMul", "Transpose", "Add", "Softmax", "Relu", "Concat", "Resize", "Mul",
       "LayerNormalization", "Sigmoid", "AveragePool")


def _entry(target: str, ops: tuple[str, ...], **metrics) -> dict:
    layers = [{"onnx_node": f"{op.lower()}_{i}", "npu_op": op.upper(), "cycles": 1000 * (i + 1), "npu_cycles": 900,
               "sram_access_cycles": 100, "macs": 10} for i, op in enumerate(ops)]
    offloads = [{"node": f"{op.lower()}_{i}", "op_type": op, "kind": "npu", "partition": 0} for i, op in enumerate(ops)]
    return {"spec": "s", "model": "m", "target": target, "status": "passed", "stages": {}, "gates": [], "errors": [],
            "metrics": {"layers": layers, "offloads": offloads, "npu_partitions": 1, **metrics}}


def test_every_per_node_chart_gives_each_op_type_its_own_colour():
    """Per-node cycle charts shared colours between op types in 33 of 37 charts (issue 35: Conv and MaxPool one
    red in digits; Gelu, MatMul and Transpose one green in the transformer): a colour came from a hash of the
    op type into 10 colours. Now every chart's op types are told apart, and an op type keeps one colour
    across the page's charts."""
    report = {"versions": {}, "builds": [_entry("ethos-u55-128", OPS), _entry("ethos-u85-256", OPS[:5]),
                                         _entry("ethos-u65-256", ("Gelu", "MatMul", "Transpose"))]}
    charts = Page(render_html(report)).charts("cycles per ONNX node")
    assert len(charts) == 3
    seen: dict[str, set[str]] = {}
    for chart in charts:
        colours = {op: c for op, c in legend(chart).items() if op != "memory-bound"}
        assert len(colours) >= 3
        assert len(set(colours.values())) == len(colours), colours  # distinct within the chart
        for op, c in colours.items():
            seen.setdefault(op, set()).add(c)
    assert all(len(c) == 1 for c in seen.values()), seen  # and the same op type the same colour on the page


def _report(**metrics) -> dict:
    entry = {"spec": "kws", "model": "ds_cnn", "target": "ethos-u55-128", "status": "passed", "stages": {},
             "gates": [], "errors": [], "metrics": metrics}
    return {"versions": {}, "builds": [entry]}


def test_the_delta_chart_draws_every_regressed_metric_coloured_by_its_direction():
    """The baseline-delta chart drew a figure title over two panel titles, an SNR improvement red (higher is
    better there) and left out the metric that regressed (quant_snr_db, -36%: only a fixed list was drawn)."""
    old = _report(inference_ms=1.0, sram_kib=100.0, tosa_snr_db=30.0, quant_snr_db=25.0, tosa_max_error_lsb=0)
    new = _report(inference_ms=0.9, sram_kib=110.0, tosa_snr_db=34.0, quant_snr_db=16.0, tosa_max_error_lsb=1)
    comparison = compare(new, old, dict(DEFAULTS))
    assert {r.metric for r in comparison.regressions} == {"sram_kib", "quant_snr_db", "tosa_max_error_lsb"}
    page = Page(render_html(new, comparison, "old/report.json"))
    chart = page.charts("change against the baseline")[0]
    panels = [t for a, t in chart.texts if a.get("font-weight") == "bold"]
    assert set(panels[:3]) == {"quant_snr_db", "sram_kib", "tosa_max_error_lsb"}  # the regressions first, each
    assert set(panels) == {"quant_snr_db", "sram_kib", "inference_ms", "tosa_snr_db", "tosa_max_error_lsb"}  # drawn
    assert min(float(a["y"]) for a, _ in chart.texts) >= 12  # nothing above the panel titles
    bars = {t.split(": ", 1)[1].split(" ")[0]: r for t, r in zip(chart.titles, [
        r for r in chart.rects if r.get("height") == "13"], strict=True)}
    assert bars["tosa_snr_db"]["fill"] == BETTER and bars["inference_ms"]["fill"] == BETTER  # higher / lower: better
    assert bars["quant_snr_db"]["fill"] == WORSE and bars["sram_kib"]["fill"] == WORSE
    assert bars["quant_snr_db"].get("stroke") == "black"  # a regression past its threshold, outlined
    assert bars["tosa_max_error_lsb"]["fill"] == WORSE  # 0 -> 1 LSB: drawn in LSB (a percent of 0 is no bar)
    units = [t for a, t in chart.texts if a.get("y") == "26"]
    assert {"dB change, higher is better", "% change, lower is better", "LSB change, lower is better"} <= set(units)
    # the Builds table's change column names the regression in the metric's words, worse first
    _, rows = page.table("builds-table")
    assert rows[0].cells[8].text == "SRAM +10.0%, QDQ SNR -9.0 dB, +3 more"
    assert "bad" in rows[0].cells[8].attrs["class"]


def test_gate_values_and_fvp_skips_read_as_figures_once():
    """Gate values were raw floats (`value 0.30362116991643456`, also in JUnit), and the FVP column repeated its
    skip reason in every row of report.md."""
    from npubuild.report.junit import junit_tree
    from npubuild.report.summary import render_markdown

    gate = {"name": "min_accuracy", "metric": "accuracy", "limit": 0.5, "value": 0.30362116991643456, "ok": False}
    skipped = {"fvp": {"status": "skipped", "reason": "no FVP found (FVP_X is not on PATH)"}}
    builds = [{"spec": "s", "model": "m", "target": f"ethos-u55-{n}", "status": "failed", "stages": skipped,
               "gates": [gate], "errors": [], "metrics": {"tosa_snr_db": 40.0, "npu_cycles": 10}}
              for n in (64, 128, 256)]
    report = {"versions": {}, "builds": builds}
    failures = [c.find("failure").get("message") for c in junit_tree(report).getroot().iter("testcase")
                if c.find("failure") is not None and c.get("name").startswith("gate ")]
    assert failures and all(f.endswith("gate min_accuracy failed: accuracy = 0.3036, limit 0.5") for f in failures)
    md = render_markdown(report)
    assert "0.30362116991643456" not in md and "accuracy = 0.3036, limit 0.5" in md
    assert md.count("no FVP found") == 1 and md.count("| skipped [1] |") == 3


def test_the_builds_table_reads_accuracy_against_float_where_the_report_has_it():
    """The slot for the accuracy work's figures: the deployed graph against float on held-back samples
    (`float_snr_db`, `float_top1_agreement`, `collapsed_outputs`) when present, else the QDQ model's SNR
    against float; a collapsed or low one is marked."""
    report = {"versions": {}, "builds": [
        dict(_report(quant_snr_db=35.0, float_snr_db=12.0, float_top1_agreement=0.9, collapsed_outputs=0,
                     tosa_snr_db=40.0, tosa_max_error_lsb=2)["builds"][0], target="ethos-u55-128"),
        dict(_report(quant_snr_db=35.0, tosa_snr_db=40.0)["builds"][0], target="ethos-u85-256")]}
    _, rows = Page(render_html(report)).table("builds-table")
    cells = {r.cells[1].text: r.cells for r in rows}
    assert cells["ethos-u55-128"][6].text == "12.0 dB \u00b7 top-1 90%" and "warn" in cells["ethos-u55-128"][6].attrs["class"]
    assert cells["ethos-u55-128"][7].text == "40.0 dB, 2 LSB"
    assert cells["ethos-u85-256"][6].text == "35.0 dB" and "warn" not in cells["ethos-u85-256"][6].attrs["class"]
