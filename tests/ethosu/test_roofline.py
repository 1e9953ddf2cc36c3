"""The roofline in report.json against a layer computed by hand: one fully connected layer through real Vela.

A 1024 -> 128 FC (int8) has 131072 MACs; it reads its 1024-byte input and writes its 128-byte output in SRAM
and streams its weights (the constants blob Vela stores for it, read once) from the constants' memory. Vela
charges a transfer by bus bursts: the U55-128 writes an NHWC output 16 bytes at a time (16 elements of 8 bits,
one core) to an SRAM whose bursts are 32 bytes, so the 128 bytes written cost 256 (regor
EstimateMemoryTransfer: bytes x burst length / burst used); the roofline divides the data bytes, 1024 + 128. On the
ethos-u55-128 profile (500 MHz, Vela's Ethos_U55_High_End_Embedded + Shared_Sram: 8-byte AXI, SRAM clock scale
1, off-chip flash 0.125) that is 8 bytes per cycle of SRAM and 1 of flash, and 128 MACs per cycle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from npbtest import read_report, run_cli
from onnx import TensorProto, helper, numpy_helper

K, N = 1024, 128


def _fc_project(root: Path, target: str) -> Path:
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.05, (N, K)).astype(np.float32)
    b = rng.normal(0, 0.1, N).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1, name="fc")], "fc",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    (root / "configs" / "models" / "fc.onnx").write_bytes(model.SerializeToString())
    (root / "configs" / "fc.yaml").write_text(
        "version: 1\nname: fc\nmodels:\n  fc:\n    path: models/fc.onnx\n"
        "    calibration: {random: {samples: 8, seed: 0}}\n"
        f"targets: [{target}]\nverify: {{tosa: false}}\n")
    return root


def _build(tmp_path: Path, capsys, target: str) -> tuple[dict, Path]:
    root = _fc_project(tmp_path / target, target)
    code, _, err = run_cli(["build", "--build-dir", str(root / "build"), "-q"], capsys, cwd=root)
    assert code == 0, err
    (b,) = read_report(root / "build")["builds"]
    return b["metrics"], Path(b["artifacts"]["vela"]).parent


def _vela_peak_gib_s(vela_log: str) -> dict[str, float]:
    names = {"SRAM": "Sram", "DRAM": "Dram", "On-chip Flash": "OnChipFlash", "Off-chip Flash": "OffChipFlash"}
    return {names[m.group(1)]: float(m.group(2))
            for m in re.finditer(r"Design peak (SRAM|DRAM|On-chip Flash|Off-chip Flash) bandwidth\s+([\d.]+) GB/s",
                                 vela_log)}


def _same_peaks_as_vela(roof: dict, vela_dir: Path) -> None:
    """Our bytes/cycle x clock against Vela's own bandwidth figures: its summary CSV (GiB/s, full precision) and
    the `Design peak ... bandwidth` lines it prints for the memories the network uses."""
    summary = json.loads((vela_dir / "summary.json").read_text())["summary"]
    column = {"Sram": "sram_bandwidth", "Dram": "dram_bandwidth", "OffChipFlash": "off_chip_flash_bandwidth"}
    for mem, per_cycle in roof["bytes_per_cycle"].items():
        gib_s = per_cycle * roof["clock_mhz"] * 1e6 / 2**30
        assert float(summary[column[mem]]) == pytest.approx(gib_s, rel=1e-6)
    printed = _vela_peak_gib_s(next(vela_dir.glob("*vela.log")).read_text())
    assert printed and all(v == round(roof["peak_gib_s"][k], 2) for k, v in printed.items())


def test_fc_layer_roofline_on_u55_matches_the_hand_computed_figures(tmp_path: Path, capsys):
    m, vela_dir = _build(tmp_path, capsys, "ethos-u55-128")
    (layer,) = m["layers"]
    assert layer["macs"] == K * N
    # bytes Vela charges the buses: input read + output written (half-burst writes) in SRAM, constants from flash
    assert layer["bytes"] == {"Sram": K + 2 * N, "OffChipFlash": m["memory"]["constants_bytes"]}
    assert layer["useful_bytes"] == {"Sram": K + N, "OffChipFlash": m["memory"]["constants_bytes"]}
    r = layer["roofline"]
    assert r["mac_bound_ms"] == pytest.approx(131072 / 128 / 500e6 * 1e3, abs=1e-6)  # 2.048 us
    assert r["memory_bound_ms"]["Sram"] == pytest.approx(1152 / 8 / 500e6 * 1e3, abs=1e-6)
    flash_ms = m["memory"]["constants_bytes"] / 1.0 / 500e6 * 1e3
    assert r["memory_bound_ms"]["OffChipFlash"] == pytest.approx(flash_ms, abs=1e-6)
    assert r["bound_by"] == "OffChipFlash" and r["bound_ms"] == pytest.approx(flash_ms, abs=1e-6)
    assert m["bound_ms"] == pytest.approx(flash_ms, abs=1e-6)
    assert m["efficiency"] == pytest.approx(flash_ms / m["inference_ms"], abs=1e-4)
    assert 0.9 < m["efficiency"] <= 1.0  # weight streaming is all Vela charges a U55 for this layer
    roof = m["roofline"]
    assert roof["bytes_per_cycle"] == {"Sram": 8.0, "OffChipFlash": 1.0} and roof["macs_per_cycle"] == 128
    _same_peaks_as_vela(roof, vela_dir)
    assert roof["worst_layers"][0]["onnx_node"] == "fc"
    build_dir = vela_dir.parents[2]
    md = (build_dir / "report.md").read_text()
    assert f"- fc/fc/ethos-u55-128: bound {m['bound_ms']:.4f} ms of {m['inference_ms']:.4f} ms estimated" in md
    assert "<b>Roofline:</b> bound" in (build_dir / "report.html").read_text()


def test_u85_roofline_uses_its_wide_bus_and_bytes_add_up_to_vela_totals(tmp_path: Path, capsys):
    m, vela_dir = _build(tmp_path, capsys, "ethos-u85-256")
    roof = m["roofline"]
    # 16-byte AXI; SRAM on 2 ports at clock scale 1, DRAM at 0.75 on 1 (Ethos_U85_SYS_DRAM_Mid)
    assert roof["bytes_per_cycle"] == {"Sram": 32.0, "Dram": 12.0} and roof["macs_per_cycle"] == 256
    _same_peaks_as_vela(roof, vela_dir)
    summary = json.loads((vela_dir / "summary.json").read_text())["summary"]
    totals = {"Sram": "sram_total_bytes", "Dram": "dram_total_bytes"}
    for mem, key in totals.items():
        assert sum(lay["bytes"].get(mem, 0) for lay in m["layers"]) == int(summary[key])
    assert roof["mac_bound_ms"] == pytest.approx(131072 / 256 / 1e9 * 1e3, abs=1e-6)
    assert 0 < m["bound_ms"] <= m["inference_ms"]
    assert m["efficiency"] == pytest.approx(m["bound_ms"] / m["inference_ms"], abs=1e-4)


def test_the_debug_database_is_read_by_column_with_vela_s_gaps(tmp_path: Path):
    """parse_layer_bytes reads only the perf and perf_debug tables, by column: a byte count or efficiency Vela
    leaves empty is 0 bytes / efficiency 1, an efficiency of 0 makes no data bytes, one above 1 counts as 1,
    and a layer perf_debug does not list has no bytes."""
    from npubuild.ethosu.perf import parse_layer_bytes

    debug = ("id,SramFeatureMap_read,SramFeatureMap_write,SramWeights_read,Sram_read_efficiency,"
             "Sram_write_efficiency,OffChipFlashWeights_read,OffChipFlash_read_efficiency,other\n"
             "7,100,50,,0.5,,,,x\n"
             "8,,,,,,64,0,y\n"
             "9,10,,20,2.75,,,,z\n")
    perf = "id,name,cycles\n7,layer-a,10\n8,layer-b,20\n9,layer-c,30\n10,layer-d,40\n"
    xml = tmp_path / "m_debug.xml"
    xml.write_text('<?xml version="1.0"?>\n<debug>\n'
                   f'<table name="perf_debug">\n<![CDATA[\n{debug}]]>\n</table>\n'
                   '<table name="queue">\n<![CDATA[\noffset,id\n0,1\n]]>\n</table>\n'
                   f'<table name="perf">\n<![CDATA[\n{perf}]]>\n</table>\n</debug>\n')
    assert parse_layer_bytes(xml) == [
        {"tensor": "layer-a", "bytes": {"Sram": 150}, "useful_bytes": {"Sram": 100}},  # 100 * 0.5 + 50 * 1
        {"tensor": "layer-b", "bytes": {"OffChipFlash": 64}, "useful_bytes": {"OffChipFlash": 0}},
        {"tensor": "layer-c", "bytes": {"Sram": 30}, "useful_bytes": {"Sram": 30}},
        {"tensor": "layer-d", "bytes": {}, "useful_bytes": {}},
    ]


def test_a_table_layer_is_bound_by_the_datapath_vela_models(tmp_path: Path, capsys):
    """A Sigmoid (one int8 TABLE) on [1, 64, 16, 16] for U85-256: one MAC an element (16384 at 256 a cycle) and 32 KiB of DRAM traffic (2731 cycles
    at 12 bytes a cycle), but the LUT writes ~2 elements a cycle (bench/elementwise_peaks.md: 1.98 on 64x64x64; its blocks), ~8-9k
    cycles for 16384 elements: the layer's bound is the datapath's, as Vela's debug database gives it."""
    root = tmp_path / "sig"
    graph = helper.make_graph([helper.make_node("Sigmoid", ["a"], ["y"], name="sig")], "sig",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 64, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 16, 16])])
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    (root / "configs" / "models" / "sig.onnx").write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    (root / "configs" / "sig.yaml").write_text(
        "version: 1\nname: sig\nmodels:\n  sig:\n    path: models/sig.onnx\n"
        "    calibration: {random: {samples: 8, seed: 0}}\ntargets: [ethos-u85-256]\nverify: {tosa: false}\n")
    code, _, err = run_cli(["build", "--build-dir", str(root / "build"), "-q"], capsys, cwd=root)
    assert code == 0, err
    (b,) = read_report(root / "build")["builds"]
    (layer,) = [lay for lay in b["metrics"]["layers"] if lay["cycles"]]
    r = layer["roofline"]
    assert r["mac_bound_ms"] < r["datapath_bound_ms"] == pytest.approx(16384 / 2 / 1e9 * 1e3, rel=0.15)
    assert r["bound_by"] == "datapath" and r["bound_ms"] == r["datapath_bound_ms"] > 2 * max(r["memory_bound_ms"].values())
    assert r["bound_ms"] <= r["estimated_ms"]
