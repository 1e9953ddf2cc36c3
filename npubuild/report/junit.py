"""JUnit XML for CI dashboards: one testcase per build and one per gate, regressions as failures.

The testcases stay the same from night to night: a build that failed before its gates were checked keeps
one testcase per gate, as an error (not evaluated, with the build's cause), a build not built keeps them
as skipped, and a build of the baseline missing from this run keeps its build and gate testcases as
failures and errors. So a dashboard tracks every gate, and a bad night does not look like fewer tests.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from npubuild.fileio import write_bytes
from npubuild.report.brief import failure_cause, gate_text
from npubuild.report.regress import Comparison, build_id
from npubuild.report.status import passed


class _Suite:
    def __init__(self) -> None:
        self.element = ET.Element("testsuite", name="npubuild")
        self.counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}

    def case(self, classname: str, name: str, seconds: float = 0.0, outcome: str | None = None,
             message: str = "", kind: str = "") -> None:
        """`outcome`: None (passed), "failure", "error" or "skipped"."""
        case = ET.SubElement(self.element, "testcase", classname=classname, name=name, time=f"{seconds:.3f}")
        self.counts["tests"] += 1
        if outcome is None:
            return
        attrs = {"message": message} | ({"type": kind} if kind and outcome != "skipped" else {})
        el = ET.SubElement(case, outcome, **attrs)
        if outcome != "skipped":
            el.text = message
        self.counts[{"failure": "failures", "error": "errors", "skipped": "skipped"}[outcome]] += 1


def _gates(suite: _Suite, b: dict, classname: str, cause: str | None) -> None:
    bid = build_id(b)
    for g in b.get("gates", []):
        name = f"gate {g['name']} {b['target']}"
        if g["ok"]:
            suite.case(classname, name)
        else:
            suite.case(classname, name, outcome="failure", kind="gate",
                       message=f"{bid}: {gate_text(g)}")
    for g in b.get("unchecked_gates", []):
        name = f"gate {g['name']} {b['target']}"
        if b["status"] == "skipped":
            suite.case(classname, name, outcome="skipped", message=f"not evaluated: {cause or 'not built'}")
        else:
            suite.case(classname, name, outcome="error", kind="not-evaluated",
                       message=f"{bid}: not evaluated, the build failed: {cause}")


def junit_tree(report: dict, comparison: Comparison | None = None, baseline: dict | None = None) -> ET.ElementTree:
    """`baseline`: the baseline report, for the gates of builds missing from this run."""
    regress: dict[str, list[str]] = {}
    for r in comparison.regressions if comparison else []:
        regress.setdefault(r.build, []).append(r.line())
    suite = _Suite()
    for b in report.get("builds", []):
        bid = build_id(b)
        classname = f"npubuild.{b['spec']}.{b['model']}"
        seconds = sum(s.get("seconds") or 0.0 for s in b.get("stages", {}).values())
        cause = failure_cause(b)
        regs = [r for r in regress.get(bid, []) if not r.startswith(f"{bid}: status ")]  # the cause says it
        if b["status"] == "skipped" and not regs:
            suite.case(classname, f"build {b['target']}", seconds, "skipped", cause or "not built")
        elif not passed(b["status"]) or regs:
            suite.case(classname, f"build {b['target']}", seconds, "failure",
                       "; ".join(([cause] if cause else []) + regs) or b["status"], "build")
        else:
            suite.case(classname, f"build {b['target']}", seconds)
        _gates(suite, b, classname, cause)
    old = {build_id(b): b for b in (baseline or {}).get("builds", [])}
    for bid in comparison.missing_builds if comparison else []:
        ob = old.get(bid, {"spec": bid.split("/")[0], "model": bid.split("/")[1], "target": bid.split("/")[2]})
        classname = f"npubuild.{ob['spec']}.{ob['model']}"
        message = f"{bid}: in the baseline but not in this run"
        suite.case(classname, f"build {ob['target']}", outcome="failure", message=message, kind="missing")
        for g in [*ob.get("gates", []), *ob.get("unchecked_gates", [])]:
            suite.case(classname, f"gate {g['name']} {ob['target']}", outcome="error", kind="not-evaluated",
                       message=f"{message}: not evaluated")
    for k, v in suite.counts.items():
        suite.element.set(k, str(v))
    root = ET.Element("testsuites")
    root.append(suite.element)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(path: Path, report: dict, comparison: Comparison | None = None, baseline: dict | None = None) -> None:
    tree = junit_tree(report, comparison, baseline)
    write_bytes(path, ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True))
