"""npu-sim feeds a family's own whole graph in the layout that graph takes: U65 reads a narrow image input
planar (NCHW, lowering/context.py), model.tosa NHWC. Fed the model's NHWC layout, the U65 deployable was
bit-exact against its TOSA graph on the same scrambled input but 3.8 dB from float on PP-OCR's direction
classifier (U55 / U85: 15.4 dB), and the collapse gate failed the build."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import tosa_reference_model as trm
from npbtest import run_cli
from npbtest.builds import write_spec
from npbtest.lowering import conv_model

from npubuild.records.lower import LowerRecord
from npubuild.tosa.run import recording, run_tosa
from npubuild.verify.npu_sim import _checked_outputs, whole_graph_specs


def test_a_planar_input_family_is_measured_against_float_in_its_own_layout(project: Path, capsys):
    onnx.save(conv_model([1, 3, 96, 96], 16, 3, stride=2), project / "configs" / "models" / "stem.onnx")
    spec = write_spec(project, "stem", "stem.onnx", [1, 3, 96, 96], "[ethos-u55-128, ethos-u65-256]")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build")], capsys, cwd=project)
    assert code == 0, err
    builds = {b["target"]: b for b in json.loads((project / "build" / "report.json").read_text())["builds"]}
    u65 = builds["ethos-u65-256"]["metrics"]
    lower = next((project / "build" / "stages" / "lower").iterdir())
    io = json.loads((lower / "io.json").read_text())
    assert io["families"]["u65"]["partitions"][0]["inputs_io"][0]["perm"] == [0, 1, 2, 3]  # planar on U65
    assert u65["float_engine"] == "virtual-device"
    # the same QDQ model and exact forms on both families: the same distance from float
    assert abs(u65["float_snr_db"] - builds["ethos-u55-128"]["metrics"]["float_snr_db"]) < 0.01
    assert abs(u65["float_snr_db"] - u65["qdq_float_snr_db"]) < 1

    # npu-sim holds the U65 deployable to model.tosa's runs that tosa-check kept: taken in model.tosa's NHWC
    # layout and laid out as the U65 graph gives its outputs, they are that graph's own outputs
    record = LowerRecord.read(lower / "io.json")
    u65_file = record.families["u65"].partitions[0].file
    inputs, outputs = whole_graph_specs(record, u65_file)
    rng = np.random.default_rng(4)
    feeds_of = [{"x": rng.uniform(-1, 1, (1, 3, 96, 96)).astype(np.float32)} for _ in range(2)]
    model_tosa = (lower / "model.tosa").read_bytes()
    with recording() as memo:
        for feeds in feeds_of[:1]:  # tosa-check kept the first sample only
            run_tosa(model_tosa, record, feeds)
    checked = _checked_outputs(lower, record, u65_file, feeds_of, memo)
    assert checked is not None and checked[1] is None
    own, status = trm.run((lower / u65_file).read_bytes(), [s.to_tosa(feeds_of[0][s.onnx_name]) for s in inputs])
    assert "VALID" in str(status)
    assert [y.shape for y in checked[0]] == [np.asarray(y).shape for y in own]
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(checked[0], own, strict=True))
