"""The digits spec turns Vela's weight buffering off: with layers this small it costs time on ethos-u85-256.

Vela DMAs a layer's weights to SRAM under the previous layer, and when the previous layer is
shorter than the transfer its estimate charges the visible transfer plus the layer's whole
unbuffered time (regor network_performance.cpp, EstimateFullOpPerformance). Both builds here
run the real Vela; the test fails if the spec's choice stops paying off.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from npbtest import REPO, read_report, run_cli

FILES = ["digits.yaml", "models/digits_cnn.onnx", "data/digits_calib.npy", "data/digits_eval_inputs.npy",
         "data/digits_eval_labels.npy"]
FLAG = "vela: {extra_flags: [--disable-buffering]}\n"


def _build_u85(root: Path, capsys, keep_flag: bool) -> dict:
    for f in FILES:
        (root / "configs" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "configs" / f, root / "configs" / f)
    (root / "dodo.py").write_text("# product repo marker\n")
    spec = root / "configs" / "digits.yaml"
    text = spec.read_text().replace("targets: [ethos-u55-128, ethos-u85-256]", "targets: [ethos-u85-256]")
    assert FLAG in text
    spec.write_text(text if keep_flag else text.replace(FLAG, ""))
    code, _, err = run_cli(["build", "--build-dir", str(root / "build"), "-q"], capsys, cwd=root)
    assert code == 0, err
    (b,) = read_report(root / "build")["builds"]
    return b["metrics"]


def test_unbuffered_weights_are_faster_on_u85(tmp_path: Path, capsys):
    flagged = _build_u85(tmp_path / "flag", capsys, keep_flag=True)
    default = _build_u85(tmp_path / "default", capsys, keep_flag=False)
    assert flagged["npu_cycles"] < 0.8 * default["npu_cycles"]  # 2348 vs 3214 with Vela 5.2
    assert flagged["sram_kib"] < default["sram_kib"]  # no staging buffers for the weights
    assert flagged["offchip_kib"] == default["offchip_kib"]
    assert flagged["tosa_snr_db"] == default["tosa_snr_db"]


def test_spec_vela_options_lay_over_the_targets_field_by_field(tmp_path: Path):
    """The spec's extra flag must not drop what a target chose elsewhere (here its raw output for npu-sim)."""
    from npubuild.config.load import load_specs

    for f in FILES:
        (tmp_path / "configs" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "configs" / f, tmp_path / "configs" / f)
    (tmp_path / "dodo.py").write_text("# product repo marker\n")
    spec = tmp_path / "configs" / "digits.yaml"
    spec.write_text(spec.read_text().replace(
        "targets: [ethos-u55-128, ethos-u85-256]",
        "targets: [{extends: ethos-u55-128, name: u55-raw, vela: {output_format: raw, optimise: Size}}]"))
    (b,) = load_specs([tmp_path / "configs"])
    assert b.vela.output_format == "raw" and b.vela.optimise == "Size"  # the target's
    assert b.vela.extra_flags == ["--disable-buffering"]  # the spec's
