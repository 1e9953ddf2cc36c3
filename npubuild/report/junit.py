"""JUnit XML for CI dashboards: one testcase per build and one per gate, regressions as failures."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from npubuild.fileio import write_bytes
from npubuild.report.regress import Comparison, build_id


def junit_tree(report: dict, comparison: Comparison | None = None) -> ET.ElementTree:
    regress: dict[str, list[str]] = {}
    for r in comparison.regressions if comparison else []:
        regress.setdefault(r.build, []).append(r.line())
    suite = ET.Element("testsuite", name="npubuild")
    tests = failures = skipped = 0
    for b in report.get("builds", []):
        bid = build_id(b)
        classname = f"npubuild.{b['spec']}.{b['model']}"
        seconds = sum(s.get("seconds") or 0.0 for s in b.get("stages", {}).values())
        case = ET.SubElement(suite, "testcase", classname=classname, name=f"build {b['target']}",
                             time=f"{seconds:.3f}")
        tests += 1
        problems = list(b.get("errors", [])) + regress.get(bid, [])
        if b["status"] == "skipped" and not problems:
            ET.SubElement(case, "skipped", message="not built (an upstream stage did not complete)")
            skipped += 1
        elif b["status"] != "passed" or problems:
            bad_gates = [g["name"] for g in b.get("gates", []) if not g["ok"]]
            msg = "; ".join(problems + ([f"gates failed: {', '.join(bad_gates)}"] if bad_gates else []))
            fail = ET.SubElement(case, "failure", message=msg or b["status"], type="build")
            fail.text = msg
            failures += 1
        for g in b.get("gates", []):
            gcase = ET.SubElement(suite, "testcase", classname=classname, name=f"gate {g['name']} {b['target']}",
                                  time="0")
            tests += 1
            if not g["ok"]:
                ET.SubElement(gcase, "failure", type="gate",
                              message=f"{bid}: {g['metric']} = {g['value']}, limit {g['name']} {g['limit']}")
                failures += 1
    suite.set("tests", str(tests))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(path: Path, report: dict, comparison: Comparison | None = None) -> None:
    tree = junit_tree(report, comparison)
    write_bytes(path, ET.tostring(tree.getroot(), encoding="utf-8", xml_declaration=True))
