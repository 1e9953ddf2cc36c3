"""tosa-check as a verification stage: per-output numerics in report.json, its gates, and the FP profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from npbtest import read_report, run_cli

from npubuild.records.iospec import IOSpec
from npubuild.report.brief import num
from npubuild.verify.numerics import compare_output


def _spec(project: Path, **replace: str) -> Path:
    spec = project / "configs" / "kws.yaml"
    text = spec.read_text().replace("targets: [ethos-u55-128, ethos-u65-256, ethos-u85-256]", "targets: [ethos-u55-128]")
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    spec.write_text(text)
    return spec


def test_every_output_is_measured_and_reported(project: Path, capsys):
    _spec(project)
    code, _, err = run_cli(["build", "--build-dir", str(project / "build"), "-q"], capsys, cwd=project)
    assert code == 0, err
    (b,) = read_report(project / "build")["builds"]
    m = b["metrics"]
    (out,) = m["outputs"].values()
    for key in ("max_error_lsb", "mean_error_lsb", "snr_db", "cosine", "top1_agreement", "quant_snr_db",
                "max_abs_error", "mean_abs_error"):
        assert key in out, key
    assert m["tosa_max_error_lsb"] == out["max_error_lsb"] <= 1
    assert m["tosa_snr_db"] == out["snr_db"] > 30
    assert 0.99 < out["cosine"] <= 1.0 + 1e-9
    # quantisation costs more than the integer graph's rounding against its own QDQ model
    assert m["quant_snr_db"] < m["tosa_snr_db"]
    (inp,) = m["io"]["inputs"]
    assert inp["dtype"] == "int8" and inp["scale"] > 0 and -128 <= inp["zero_point"] <= 127
    assert inp["onnx_shape"] == [1, 1, 49, 10] and inp["shape"] == [1, 49, 10, 1] and inp["layout"] == "NHWC"


def test_impossible_numerics_gates_fail_with_exit_1_naming_gate_limit_and_value(project: Path, capsys):
    _spec(project, **{"min_tosa_snr_db: 30": "min_tosa_snr_db: 1000\n  min_quant_snr_db: 900\n  min_accuracy: 0.5"})
    code, _, err = run_cli(["build", "--build-dir", str(project / "build"), "-q"], capsys, cwd=project)
    assert code == 1
    (b,) = read_report(project / "build")["builds"]
    assert b["status"] == "failed"
    bad = {g["name"]: g for g in b["gates"] if not g["ok"]}
    assert set(bad) == {"min_tosa_snr_db", "min_quant_snr_db", "min_accuracy"}
    assert bad["min_tosa_snr_db"]["value"] < 1000 and bad["min_quant_snr_db"]["value"] < 900
    assert bad["min_accuracy"]["value"] is None  # no evaluation set: the gate cannot hold
    ok = {g["name"] for g in b["gates"] if g["ok"]}
    assert {"npu_offload", "max_tosa_error_lsb"} <= ok
    for name in ("min_tosa_snr_db", "min_quant_snr_db"):
        line = next(ln for ln in err.splitlines() if f"gate {name} failed" in ln)
        assert line.endswith(f"= {num(bad[name]['value'])}, limit {num(bad[name]['limit'])}")  # figures as read


def test_fp_profile_checks_the_lowering_alone(project: Path, capsys):
    _spec(project, **{"pipeline: default": "pipeline: fp", "  max_tosa_error_lsb: 1\n": "",
                      "  max_tosa_node_error_lsb: 1\n": ""})  # the LSB gates are the INT profile's
    code, _, err = run_cli(["build", "--build-dir", str(project / "build"), "-q"], capsys, cwd=project)
    assert code == 0, err
    (b,) = read_report(project / "build")["builds"]
    assert b["status"] == "passed"
    assert "quantize" not in b["stages"] and "vela" not in b["stages"]
    m = b["metrics"]
    # float TOSA against float onnxruntime: only float rounding differs
    assert m["tosa_snr_db"] > 100 and m["tosa_cosine"] > 0.999999
    assert m["tosa_max_error_lsb"] is None and m["quant_snr_db"] is None
    assert m["io"]["inputs"][0]["dtype"] == "float32"


def test_lsb_error_and_compare_output_measure_what_they_say():
    ref = np.array([[0.0, 0.5, 1.0]])
    scale, zp = 0.5 / 64, -3
    q = np.round(ref / scale) + zp
    q[0, 2] -= 2  # two LSB off on one element
    err = IOSpec("y", "y", (1, 3), (0, 1), "int8", scale, zp).lsb_error(ref, q)
    assert err.tolist() == [[0.0, 0.0, 2.0]]  # 1.0 / scale + zp = 125 fits int8; no clipping
    got = (q - zp) * scale
    entry = compare_output(ref, got, flt=ref, lsb=err)
    assert entry["max_error_lsb"] == 2.0 and abs(entry["mean_error_lsb"] - 2 / 3) < 1e-12
    assert entry["top1_agreement"] == 1.0 and entry["max_abs_error"] == 2 * scale
