"""`npubuild report --baseline`: deltas, YAML thresholds, regressions named, JUnit XML, report.html."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from npbtest import read_report, run_cli
from npbtest.htmlpage import Page

from npubuild.report.plots import WORSE


def _nightly(project: Path, capsys, name: str) -> Path:
    """One nightly-style run into its own build dir; returns its report.json (kept like last night's)."""
    build_dir = project / "build"
    code, _, err = run_cli(["build", "--build-dir", str(build_dir), "-q"], capsys, cwd=project)
    assert code == 0, err
    keep = project / f"{name}.json"
    shutil.copy(build_dir / "report.json", keep)
    return keep


def _slow_u55(project: Path) -> None:
    (project / "targets").mkdir(exist_ok=True)
    (project / "targets" / "ethos-u55-128.yaml").write_text("extends: ethos-u55-128\nclock_mhz: 250\n")


def test_two_runs_report_no_regression_and_junit_parses(project: Path, capsys):
    base = _nightly(project, capsys, "night1")
    _nightly(project, capsys, "night2")
    junit = project / "junit.xml"
    code, out, err = run_cli(["report", "--build-dir", "build", "--baseline", str(base), "--junit", str(junit)],
                             capsys, cwd=project)
    assert code == 0, err
    assert "No regression." in out and "3 build(s) with unchanged metrics." in out
    assert "regression:" not in err
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    builds = read_report(project / "build")["builds"]
    n_gates = sum(len(b["gates"]) for b in builds)
    assert n_gates >= 3 * 3
    assert len(cases) == len(builds) + n_gates == int(suite.get("tests"))
    assert suite.get("failures") == "0" and not any(c.find("failure") is not None for c in cases)
    assert {c.get("name") for c in cases if c.get("name").startswith("build ")} == {
        f"build {b['target']}" for b in builds}


def test_lower_clock_is_a_named_regression_with_exit_1(project: Path, capsys):
    base = _nightly(project, capsys, "night1")
    _slow_u55(project)
    code, _, err = run_cli(["build", "--build-dir", "build", "-q"], capsys, cwd=project)
    assert code == 0, err  # the build itself passes its gates: only the comparison finds it slower
    junit = project / "junit.xml"
    code, out, err = run_cli(["report", "--baseline", str(base), "--junit", str(junit)], capsys, cwd=project)
    assert code == 1
    lines = [ln for ln in err.splitlines() if ln.startswith("regression:")]
    assert lines and all("kws/ds_cnn/ethos-u55-128" in ln for ln in lines)
    assert any(" inference_ms " in ln for ln in lines)
    old = json.loads(base.read_text())["builds"]
    old_ms = next(b for b in old if b["target"] == "ethos-u55-128")["metrics"]["inference_ms"]
    new_ms = next(b for b in read_report(project / "build")["builds"]
                  if b["target"] == "ethos-u55-128")["metrics"]["inference_ms"]
    assert f"inference_ms {old_ms:.6g} -> {new_ms:.6g}" in err
    assert "ethos-u65-256" not in err and "ethos-u85-256" not in err
    failed = [c for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["build ethos-u55-128"]
    assert "inference_ms" in failed[0].find("failure").get("message")
    # the HTML page shows the regression in its delta chart, red (slower is worse) and outlined
    html = (project / "build" / "report.html").read_text()
    assert "1 regression(s)" in html and "http://" not in html and "https://" not in html
    chart = Page(html).charts("change against the baseline")[0]
    assert "inference_ms" in chart.attrs["aria-label"]
    bar = next(r for r in chart.rects if r.get("stroke") == "black")
    assert bar["fill"] == WORSE
    assert any(t.startswith("kws/ds_cnn/ethos-u55-128: inference_ms +") and t.endswith("(regression)")
               for t in chart.titles)
    pools = html.split('<svg role="img" aria-label="memory use per pool"')[1].split("</svg>")[0]
    assert all(f"<title>kws/ds_cnn/{t}  " in pools for t in ("ethos-u55-128", "ethos-u65-256", "ethos-u85-256"))


def test_thresholds_come_from_regressions_yaml(project: Path, capsys):
    base = _nightly(project, capsys, "night1")
    _slow_u55(project)
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    (project / "regressions.yaml").write_text("version: 1\nmetrics:\n  inference_ms: {max_increase_pct: 150}\n")
    code, out, err = run_cli(["report", "--baseline", str(base)], capsys, cwd=project)
    assert code == 0, err
    assert "| inference_ms |" in out and "(+100.00%) | +150% | no |" in out
    assert "No regression." in out
    (project / "regressions.yaml").write_text("version: 1\nmetrics:\n  inference_ms: {max_increase_pct: -1}\n")
    code, _, err = run_cli(["report", "--baseline", str(base)], capsys, cwd=project)
    assert code == 2
    assert err.count("\n") == 1 and "regressions.yaml:3:" in err and "max_increase_pct" in err


def test_tool_version_change_is_shown_beside_the_deltas(project: Path, capsys):
    base = _nightly(project, capsys, "night1")
    old = json.loads(base.read_text())
    old["versions"]["ethos-u-vela"] = "5.1.0"  # last night ran an older Vela
    base.write_text(json.dumps(old))
    code, out, _ = run_cli(["report", "--baseline", str(base)], capsys, cwd=project)
    assert code == 0
    new_vela = read_report(project / "build")["versions"]["ethos-u-vela"]
    assert f"Tool versions changed: ethos-u-vela 5.1.0 -> {new_vela}" in out


def test_missing_or_bad_baseline_is_one_line_exit_2(project: Path, capsys):
    _nightly(project, capsys, "night1")
    code, _, err = run_cli(["report", "--baseline", "nope.json"], capsys, cwd=project)
    assert code == 2 and err.count("\n") == 1 and "nope.json" in err
    (project / "bad.json").write_text("{")
    code, _, err = run_cli(["report", "--baseline", "bad.json"], capsys, cwd=project)
    assert code == 2 and err.count("\n") == 1 and "not a valid report" in err


def test_report_html_draws_one_bar_per_onnx_node_for_every_build(project: Path, capsys):
    from npubuild.report.html import node_layers, render_html

    _nightly(project, capsys, "night1")
    report = read_report(project / "build")
    assert all(b["metrics"].get("layers") for b in report["builds"])
    # a nightly-sized report: the three real builds repeated under more target names
    many = [dict(b, target=f"{b['target']}-{i}") for i in range(4) for b in report["builds"]]
    many[-1] = dict(many[-1], status="failed")
    html = render_html({**report, "builds": many}, cache_dir=project / "plots")
    sections = re.split(r"<details id=\"b\d+\"(?: open)?><summary class=", html)[1:]
    assert len(sections) == len(many) and all("cycles per ONNX node" in s for s in sections)
    assert sections[0].split("</summary>")[0].count(many[-1]["target"]) == 1  # the failed build comes first
    # Vela layers of one ONNX node are summed into one bar (a softmax is many NPU ops, one node)
    m = report["builds"][0]["metrics"]
    nodes = node_layers({**m, "layers": m["layers"] + [dict(m["layers"][0], cycles=5, npu_cycles=5)]})
    assert len(nodes) == len({lay["onnx_node"] for lay in m["layers"]})
    first = nodes[0]
    same = sum(lay["cycles"] for lay in m["layers"] if lay["onnx_node"] == m["layers"][0]["onnx_node"])
    assert first["cycles"] == same + 5 and first["bound"] in ("compute", "memory")
