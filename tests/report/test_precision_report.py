"""A `precision: auto` build end to end: the layer it promotes in report.json, report.md, the HTML report and
`npubuild offloads`."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from npbtest import run_cli
from npbtest.builds import sensitive_conv_model, write_spec


def test_auto_precision_is_reported_everywhere(project: Path, capsys):
    onnx.save(sensitive_conv_model(), project / "configs" / "models" / "sensitive.onnx")
    spec = write_spec(project, "sens", "sensitive.onnx", [1, 3, 8, 8], "[ethos-u55-128]",
                      extra="quantization: {precision: auto, budget: {min_snr_db: 30, weights_int4: false}}\n")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build")], capsys, cwd=project)
    assert code == 0, err
    report = json.loads((project / "build" / "report.json").read_text())
    p = report["builds"][0]["metrics"]["precision"]
    assert p["mode"] == "auto" and p["met"] and p["int16_layers"] == ["conv2"] and p["int16_groups"] == 1
    assert [c["layers"] for c in p["int16_choices"]] == [["conv2"]]
    assert p["chosen"]["snr_db"] > p["int8"]["snr_db"] + 20
    m = report["builds"][0]["metrics"]  # the deployed graph set beside the QDQ model it implements, not the int8 one
    assert m["float_snr_db"] > p["int8"]["snr_db"] + 20 and abs(m["float_snr_db"] - m["qdq_float_snr_db"]) < 1
    md = (project / "build" / "report.md").read_text()
    assert "## Precision" in md and "| int16 | conv2 |" in md
    html = (project / "build" / "report.html").read_text()
    assert "<h4>Precision</h4>" in html and "<td>conv2</td>" in html
    offloads = {o["node"]: o.get("precision") for o in report["builds"][0]["metrics"]["offloads"]}
    assert offloads == {"conv1": "8x8", "conv2": "8x8->int16", "conv3": "16x8->int8", "conv4": "8x8"}
    code, out, err = run_cli(["offloads", str(spec), "--target", "ethos-u55-128", "--build-dir",
                              str(project / "build")], capsys, cwd=project)
    assert code == 0, err
    assert "conv2  Conv  8x8->int16  -> NPU partition 0" in out
