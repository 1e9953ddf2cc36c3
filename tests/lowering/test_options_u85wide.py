"""The widest U85s (1024 and 2048 MACs) as their own lowering family "u85wide" (Accelerator.lowering_family, lowering/options.py).

They run U85's TOSA op set, so they are placed by U85's support rules, but they are lowered on their own:
the U85-256 Concat forms (copied inputs first, the copy as a MAXIMUM of itself) make Vela lay the Concat
out NHWC and copy it elementwise, which its reader conv and the copy run slower on the widest arrays, so the
wide family keeps Vela's own copy; the zero conv taps and the int32 softmax exp hold there too.
A build for ethos-u85-2048 compiles u85wide_model.tosa where it differs from model.tosa.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import onnx
import tosa_serializer as ts
from npbtest import read_report, run_cli
from npbtest.lowering import assert_same_reference, downsampling_block, max_copies, models, ops  # noqa: F401  (models: fixture)
from npbtest.ops import calib, quantize_model, vela_run
from npbtest.support import compare, rule_verdict, vela_compiles

from npubuild.config.accelerator import Accelerator, rules_of
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import FAMILY_OPTIONS, ConcatCopy

U85, WIDE = "ethos-u85-256", "ethos-u85-2048"


def test_family_of_each_u85():
    accs = [f"ethos-u85-{m}" for m in (128, 256, 512, 1024, 2048)]
    assert [Accelerator.parse(a).lowering_family for a in accs] == ["u85", "u85", "u85", "u85wide", "u85wide"]
    assert rules_of("u85wide") == "u85"


def test_wide_u85_is_placed_by_u85_rules_as_vela_agrees():
    greater = compare("GREATER", ts.DType.INT32)
    assert rule_verdict(greater, WIDE) == rule_verdict(greater, U85) is None
    assert vela_compiles(greater, WIDE)


def test_wide_u85_keeps_velas_concat_copy(models):  # noqa: F811
    """The U-Net step: U85 copies the skip first by a MAXIMUM; the wide family lowers it portably, faster there."""
    _, _, shared = models
    assert not FAMILY_OPTIONS["u85wide"].concat_order and FAMILY_OPTIONS["u85wide"].concat_copy == ConcatCopy.VELA
    u85 = lower_model(copy.deepcopy(shared), "int", family="u85")
    wide = lower_model(copy.deepcopy(shared), "int", family="u85wide")
    assert max_copies(u85.tosa) == [0] and max_copies(wide.tosa) == []
    assert wide.tosa == lower_model(copy.deepcopy(shared), "int").tosa
    # measured 7596 (U85 form) vs 4202 cycles on U85-2048, 8906 vs 9651 on U85-256
    assert vela_run(wide.tosa, WIDE).cycles < vela_run(u85.tosa, WIDE).cycles


def test_wide_u85_takes_the_zero_taps():
    qdq = quantize_model(downsampling_block(), calib("x", [1, 32, 16, 16]))
    portable, wide = lower_model(qdq, "int"), lower_model(qdq, "int", family="u85wide")
    assert "SLICE" in ops(portable) and "SLICE" not in ops(wide)
    assert_same_reference(portable, wide)
    assert vela_run(wide.tosa, WIDE).cycles < vela_run(portable.tosa, WIDE).cycles


def test_wide_u85_target_compiles_its_own_lowering(project: Path, capsys):
    models_dir = project / "configs" / "models"
    onnx.save(quantize_model(downsampling_block(), calib("x", [1, 32, 16, 16])), models_dir / "block.onnx")
    (project / "configs" / "block.yaml").write_text(f"""version: 1
name: block
models:
  m:
    path: models/block.onnx
    input_shapes: {{x: [1, 32, 16, 16]}}
    calibration: {{random: {{samples: 8, seed: 0}}}}
targets: [{U85}, {WIDE}]
verify: {{tosa: true, samples: 2}}
""")
    build_dir = project / "build"
    code, _, err = run_cli(["build", str(project / "configs" / "block.yaml"), "--build-dir", str(build_dir), "-q"],
                           capsys)
    assert code == 0, err
    builds = {b["target"]: b for b in read_report(build_dir)["builds"]}
    assert {t: b["status"] for t, b in builds.items()} == {U85: "passed", WIDE: "passed"}
    assert builds[WIDE]["metrics"]["deployed_max_error_lsb"] <= 1.0
    lower_dir = next((build_dir / "stages" / "lower").glob("m-*"))
    io = json.loads((lower_dir / "io.json").read_text())
    files = {f: [p["file"] for p in r["partitions"]] for f, r in io["families"].items()}
    assert files["u85"] == ["u85_model.tosa"] and files["u85wide"] == ["u85wide_model.tosa"]
    model = onnx.load(str(lower_dir / "model_partitioning.onnx"))
    assert (lower_dir / "u85wide_model.tosa").read_bytes() == lower_model(model, "int", family="u85wide").tosa
    vela_wide = next((build_dir / "stages" / "vela").glob(f"m-{WIDE}-*"))
    assert (vela_wide / "u85wide_model_per-layer.csv").is_file()
    assert not (vela_wide / "model_per-layer.csv").exists()
