"""U65 as its own lowering family (Accelerator.lowering_family, lowering/options.py).

U65 runs U55's TOSA op set, so it is placed by U55's support rules, but it is lowered on its own: a form
only U55 needs (the bilinear upsample in two channel halves, for U55-128's SRAM) is left out on U65,
where Vela runs the one-piece form faster. A build for an ethos-u65 target compiles u65_model.tosa.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from npbtest import read_report, run_cli
from npbtest.lowering import BIG_UNET, qdq_unet_step
from npbtest.ops import vela_run
from npbtest.support import compare, rule_verdict, vela_compiles

from npubuild.config.accelerator import Accelerator
from npubuild.ethosu.partition import plan_partitions
from npubuild.lowering.driver import lower_model
from npubuild.tosa.run import run_tosa

U55, U65 = "ethos-u55-128", "ethos-u65-256"
U65_RAW = "{extends: ethos-u65-256, name: u65-raw, vela: {output_format: raw}}"  # npu-sim runs raw


def test_family_of_each_accelerator():
    assert [Accelerator.parse(a).lowering_family for a in ("ethos-u55-32", "ethos-u65-256", "ethos-u65-512", "ethos-u85-512", "ethos-u85-1024")] \
        == ["u55", "u65", "u65", "u85", "u85wide"]


def test_u65_is_placed_by_u55_rules_as_vela_agrees():
    import tosa_serializer as ts

    greater = compare("GREATER", ts.DType.INT32)
    assert rule_verdict(greater, U65) == rule_verdict(greater, U55) == "u55-op-type"
    assert not vela_compiles(greater, U65)


def test_u65_keeps_the_upsample_whole_where_u55_splits_it():
    qdq = qdq_unet_step(*BIG_UNET)
    u55, u65 = lower_model(qdq, "int", family="u55"), lower_model(qdq, "int", family="u65")
    # both replicate (nearest RESIZE) + blur, as neither runs a bilinear RESIZE; U55 in two channel halves
    (resize,) = [n.name for n in qdq.graph.node if n.op_type == "Resize"]
    assert u55.node_ops[resize].count("RESIZE") == 2 and u65.node_ops[resize].count("RESIZE") == 1
    assert all(p.kind == "npu" for p in plan_partitions(qdq, u65, "u65").placements.values())
    shape = [d.dim_value for d in qdq.graph.input[0].type.tensor_type.shape.dim]
    assert u65.inputs[0].perm == (0, 1, 2, 3)  # two channels: U65 reads the input planar (options.py)
    for seed in range(2):  # the same integers either way (fed in the ONNX layout, each graph's io lays it out)
        feeds = {qdq.graph.input[0].name: np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)}
        a, b = run_tosa(u55.tosa, u55, feeds), run_tosa(u65.tosa, u65, feeds)
        assert all(np.array_equal(a[k], b[k]) for k in a)
    split, whole = vela_run(u55.tosa, U65).summary, vela_run(u65.tosa, U65).summary
    assert float(whole["cycles_total"]) < 0.95 * float(split["cycles_total"])  # measured 99400 -> 93919


def test_u65_target_compiles_its_own_lowering(project: Path, capsys):
    models = project / "configs" / "models"
    onnx.save(qdq_unet_step(*BIG_UNET), models / "step.onnx")  # already QDQ: the quantize stage keeps it
    (project / "configs" / "step.yaml").write_text(f"""version: 1
name: step
models:
  m:
    path: models/step.onnx
    input_shapes: {{x: [1, 2, {BIG_UNET[0]}, {BIG_UNET[0]}]}}
    calibration: {{random: {{samples: 8, seed: 0}}}}
targets: [{U55}, {U65_RAW}]
verify: {{tosa: true, samples: 2}}
""")
    build_dir = project / "build"
    code, _, err = run_cli(["build", str(project / "configs" / "step.yaml"), "--build-dir", str(build_dir), "-q"],
                           capsys)
    assert code == 0, err
    builds = {b["target"]: b for b in read_report(build_dir)["builds"]}
    assert {t: b["status"] for t, b in builds.items()} == {U55: "passed", "u65-raw": "passed"}
    # the U65 artifact of its own lowering computes what that TOSA graph does, bit for bit (npu-sim)
    assert builds["u65-raw"]["metrics"]["npusim_bitexact"] is True
    lower_dir = next((build_dir / "stages" / "lower").glob("m-*"))
    io = json.loads((lower_dir / "io.json").read_text())
    files = {f: [p["file"] for p in r["partitions"]] for f, r in io["families"].items()}
    assert files["u55"] == ["u55_model.tosa"] and files["u65"] == ["u65_model.tosa"]
    model = onnx.load(str(lower_dir / "model_partitioning.onnx"))
    assert (lower_dir / "u65_model.tosa").read_bytes() == lower_model(model, "int", family="u65").tosa
    assert (lower_dir / "u65_model.tosa").read_bytes() != (lower_dir / "u55_model.tosa").read_bytes()
    vela_u65 = next((build_dir / "stages" / "vela").glob("m-u65-raw-*"))
    assert (vela_u65 / "u65_model_per-layer.csv").is_file()
