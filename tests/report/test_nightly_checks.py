"""Nightly jobs that cannot pass silently, and the report people read.

Three nights of the same product repo: all builds pass; then the U55 board's SRAM shrinks so that build
fails at Vela; then two of the three targets vanish from the spec. The baseline comparison names the
failure with its cause and the vanished builds, counts neither as unchanged, JUnit keeps the same
testcases every night, and report.html shows fit, cause, placement and the history of the runs.
"""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from npbtest import run_cli
from npbtest.htmlpage import Page

U55 = "kws/ds_cnn/ethos-u55-128"


def _night(project: Path, capsys, name: str, expect: int = 0) -> Path:
    code, _, err = run_cli(["build", "-q", "--keep-going"], capsys, cwd=project)
    assert code == expect, err
    keep = project / f"{name}.json"
    shutil.copy(project / "build" / "report.json", keep)
    return keep


def _report(project: Path, capsys, *args: str) -> tuple[int, str, str]:
    return run_cli(["report", *args], capsys, cwd=project)


def _junit_cases(path: Path) -> dict[str, str]:
    """testcase name -> its outcome (passed, failure, error, skipped)."""
    out = {}
    for c in ET.parse(path).getroot().iter("testcase"):
        kids = [k.tag for k in c]
        out[f"{c.get('classname')} {c.get('name')}"] = kids[0] if kids else "passed"
    return out


@pytest.fixture
def nights(project: Path, capsys) -> tuple[Path, Path]:
    """night1: every build passes; night2: the U55 board's SRAM is 1 KiB, that build fails at Vela."""
    night1 = _night(project, capsys, "night1")
    (project / "targets").mkdir()
    (project / "targets" / "ethos-u55-128.yaml").write_text("extends: ethos-u55-128\npools: {sram: {size_kib: 1}}\n")
    night2 = _night(project, capsys, "night2", expect=1)
    return night1, night2


def test_a_failed_build_is_a_regression_with_its_cause_and_junit_keeps_its_gates(project: Path, capsys, nights):
    night1, _ = nights
    code, out, err = _report(project, capsys, "--baseline", str(night1))
    assert code == 1
    regressions = [ln for ln in err.splitlines() if ln.startswith("regression:")]
    assert regressions == [next(ln for ln in regressions if ln.startswith(
        f"regression: {U55}: status passed -> failed: vela: target 'ethos-u55-128': pool 'sram'"))]
    assert "n/a" not in err
    assert "2 build(s) with unchanged metrics." in out and f"1 build(s) did not pass: {U55}" in out
    assert "target profile changed" in out  # what changed, beside the regression
    # a summary before the baseline section, not the whole report.md (~680 lines for 40 builds)
    summary = out[:out.index("## Against the baseline")].splitlines()
    assert summary[0].startswith("3 builds: 2 passed, 1 failed, 0 skipped")
    assert summary[1].startswith(f"FAILED  {U55}: vela: target 'ethos-u55-128': pool 'sram'")
    assert summary[2].startswith("full report: ") and len(summary) == 4 and not summary[3]
    code, full, _ = _report(project, capsys, "--markdown")
    assert code == 1 and "## Gates and memory" in full and "## Gates and memory" not in out
    # JUnit: the same testcases as on the passing night, the failed build's gates as errors (not evaluated)
    run_cli(["report", "--build-dir", "build", "--junit", "night2.xml"], capsys, cwd=project)
    shutil.copy(night1, project / "build" / "report.json")
    run_cli(["report", "--junit", "night1.xml"], capsys, cwd=project)
    passing, failing = _junit_cases(project / "night1.xml"), _junit_cases(project / "night2.xml")
    assert set(passing) == set(failing) and all(v == "passed" for v in passing.values())
    gates = {k: v for k, v in failing.items() if "gate " in k and k.endswith("ethos-u55-128")}
    # kws.yaml's five and the int profile's default max_collapsed_outputs (config/metrics.DEFAULT_GATES)
    assert len(gates) == 6 and set(gates.values()) == {"error"}
    assert failing["npubuild.kws.ds_cnn build ethos-u55-128"] == "failure"
    suite = ET.parse(project / "night2.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == (str(len(failing)), "1", "6")


def test_builds_missing_from_the_run_are_regressions_unless_not_asked_for(project: Path, capsys):
    night1 = _night(project, capsys, "night1")
    spec = project / "configs" / "kws.yaml"
    spec.write_text(spec.read_text().replace("targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]",
                                             "targets: [ethos-u85-256]"))
    assert run_cli(["build", "-q"], capsys, cwd=project)[0] == 0
    code, out, err = _report(project, capsys, "--baseline", str(night1), "--junit", "junit.xml")
    assert code == 1
    lost = [ln for ln in err.splitlines() if ln.startswith("regression:")]
    assert len(lost) == 2 and all("status passed -> missing: not in this run" in ln for ln in lost)
    assert "1 build(s) with unchanged metrics." in out
    cases = _junit_cases(project / "junit.xml")
    assert cases["npubuild.kws.ds_cnn build ethos-u55-128"] == "failure"
    assert len(cases) == 3 + sum(len(b["gates"]) for b in json.loads(night1.read_text())["builds"])

    # a run that was asked for one target only (--only) did not lose the other two
    spec.write_text(spec.read_text().replace("targets: [ethos-u85-256]",
                                             "targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]"))
    assert run_cli(["build", "-q", "--only", "ethos-u85-*"], capsys, cwd=project)[0] == 0
    code, out, err = _report(project, capsys, "--baseline", str(night1))
    assert code == 0, err
    assert "No regression." in out and "Baseline builds this run did not ask for (--only or spec selection): 2" in out


def test_report_html_answers_fit_cause_placement_time_and_history(project: Path, capsys, nights):
    night1, _ = nights
    history = project / "history"
    shutil.copy(project / "build" / "report.json", project / "night2-kept.json")
    shutil.copy(night1, project / "build" / "report.json")
    assert _report(project, capsys, "--history", str(history))[0] == 0  # night1 into the store
    shutil.copy(project / "night2-kept.json", project / "build" / "report.json")
    code, out, _ = _report(project, capsys, "--baseline", str(night1), "--history", str(history))
    assert code == 1 and "History: 2 run(s)" in out
    assert len(list(history.glob("*.json"))) == 2
    page = (project / "build" / "report.html").read_text()
    assert "http://" not in page and "https://" not in page  # self-contained
    html = Page(page)
    head, rows = html.table("builds-table")
    assert head == ["build", "target", "status", "fit", "ms", "NPU", "vs float", "TOSA vs QDQ", "change", "problem"]
    by_target = {r.cells[1].text: r for r in rows}
    first = rows[0]
    assert first.attrs["data-problem"] == "1" and first.attrs["data-build"] == U55  # failed builds first
    assert first.cells[2].text == "failed" and first.cells[9].text.startswith(
        "vela: target 'ethos-u55-128': pool 'sram'")  # the cause, in the main table
    # fit, accuracy and change for every build on one line each: the failed one shows what it needs
    assert re.fullmatch(r"sram needs \d+(\.\d)?/1 KiB", first.cells[3].text), first.cells[3].text
    for t in ("ethos-u65-256", "ethos-u85-256"):
        r = by_target[t]
        assert re.fullmatch(r"sram \d+% \u00b7 [\d.]+/\d+ KiB", r.cells[3].text), r.cells[3].text
        # against float: its SNR, and the agreement that decides where the output is a classifier's
        assert re.fullmatch(r"\d+\.\d dB( \u00b7 (top-1|IoU|agree) \d+%)?", r.cells[6].text), r.cells[6].text
        assert re.fullmatch(r"[\d.]+ dB, \d+ LSB", r.cells[7].text), r.cells[7].text
        assert r.cells[8].text == "="  # against the baseline: nothing moved
        assert float(r.cells[4].attrs["data-v"]) > 0  # raw value to sort by
    assert "change: against the baseline" in page
    assert "History: 2 stored runs" in page and 'alt="inference_ms per run"' in page
    # every build that reached Vela has its per-node chart; artifact links resolve from the page
    assert len(html.charts("cycles per ONNX node")) == 2
    assert f'<details id="b0" open><summary class="failed">{U55}: failed' in page  # the failure is open to read
    links = set(re.findall(r'<a href="([^"]+)">firmware \.c</a>', page))  # in each build's panel
    assert len(links) == 2 and all((project / "build" / href).is_file() for href in links)
    assert "target profile changed" in page  # what changed, beside the regression
    assert "clock MHz" in page and "inferences/s" in page and ">compute</td>" in page and "What runs where" in page


def test_the_fit_table_has_a_row_for_every_build_with_what_a_misfit_needs(project: Path, capsys, nights):
    """The fit table left out exactly the builds that do not fit (issue 35): now the U55 build whose SRAM is 1 KiB
    has its pools with what Vela says they need, and the Builds table's fit cell says it too."""
    _, night2 = nights
    report = json.loads(night2.read_text())
    failed = next(b for b in report["builds"] if b["target"] == "ethos-u55-128")
    sram = next(p for p in failed["metrics"]["pools"] if p["pool"] == "sram")
    assert not sram["fits"] and sram["size_kib"] == 1 and sram["used_kib"] > 1 and sram["lower_bound"] is False
    _, rows = Page((project / "build" / "report.html").read_text()).table("fit-table")
    builds = {r.cells[0].text for r in rows}
    assert builds == {f"kws/ds_cnn/{t}" for t in ("ethos-u55-128", "ethos-u65-256", "ethos-u85-256")}
    misfit = next(r for r in rows if r.cells[0].text == U55 and r.cells[1].text == "sram")
    assert misfit.cells[8].text == f"NO: needs {sram['used_kib']:.1f} of 1 KiB"
    assert float(misfit.cells[4].attrs["data-v"]) == sram["used_kib"]


def test_failure_causes_and_numbers_read_the_same_everywhere():
    from npubuild.report.brief import failure_cause, num

    assert [num(v) for v in (0.271856, 265.484, 152.1145, 271856, 12345.6, None, 0.75)] == [
        "0.2719", "265.5", "152.1", "271856", "12346", "-", "0.75"]
    entry = {"status": "failed", "stages": {"vela": {"status": "failed", "error": "error: pool\nmore"}},
             "errors": ["x"], "gates": []}
    assert failure_cause(entry) == "vela: pool"
    gated = {"status": "failed", "stages": {}, "errors": [],
             "gates": [{"name": "max_sram_kib", "metric": "sram_kib", "limit": 128, "value": 176.0, "ok": False}]}
    assert failure_cause(gated) == "gate max_sram_kib failed: sram_kib = 176, limit 128"
    assert failure_cause({"status": "passed"}) is None


def test_history_keeps_the_newest_runs_once_each_and_draws_a_series_per_build(tmp_path: Path):
    from npubuild.report import history
    from npubuild.report.plots import history_chart

    def run(i: int, ms: float) -> dict:
        build = {"spec": "kws", "model": "ds_cnn", "target": "ethos-u55-128", "status": "passed",
                 "metrics": {"inference_ms": ms, "layers": [{"cycles": 1}], "npu_offload": 1.0}}
        return {"run_id": f"r{i}", "created": f"2026-11-0{i}T02:00:00+0000", "versions": {}, "builds": [build]}

    store = tmp_path / "hist"
    for i, ms in enumerate((0.27, 0.27, 0.54, 0.54), start=1):
        runs = history.record(store, run(i, ms), keep=3)
    assert [r["run_id"] for r in runs] == ["r2", "r3", "r4"]  # the newest three, oldest first
    assert history.record(store, run(4, 0.54), keep=3) == runs  # the same run is stored once
    assert "layers" not in runs[0]["builds"][0]["metrics"]  # slimmed to scalars
    assert history.series(runs, "inference_ms") == [("kws/ds_cnn/ethos-u55-128", [0.27, 0.54, 0.54])]
    assert history.run_labels(runs) == ["11-02 02:00", "11-03 02:00", "11-04 02:00"]
    png = history_chart("inference_ms", history.run_labels(runs), history.series(runs, "inference_ms"))
    assert png.startswith(b"\x89PNG")
