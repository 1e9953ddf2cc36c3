"""The npu-sim stage in real builds: DS-CNN bit-exact on U55/U65/U85 (incl. --optimise Size, and the default .tflite), and a corrupted
weight byte named by its op on U55 and on U85."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from npbtest import read_report, run_cli

from npubuild.npusim.cmdstream import U55, decode
from npubuild.npusim.npz import load_raw
from npubuild.npusim.sim import run, run_samples
from npubuild.npusim.u85.registers import COMMANDS
from npubuild.npusim.verify import compare
from npubuild.records.lower import LowerRecord

SPEC = """version: 1
name: kws
models:
  ds_cnn:
    path: models/ds_cnn.onnx
    input_shapes: {input: [1, 1, 49, 10]}
    calibration: {random: {samples: 16, seed: 0, low: -1.0, high: 1.0}}
targets:
  - {extends: ethos-u55-128, name: u55-raw, vela: {output_format: raw}}
  - {extends: ethos-u55-128, name: u55-size, vela: {output_format: raw, optimise: Size}}
  - {extends: ethos-u65-512, name: u65-raw, vela: {output_format: raw}}
  - {extends: ethos-u85-256, name: u85-raw, vela: {output_format: raw}}
  - {extends: ethos-u85-2048, name: u85-2048-size, vela: {output_format: raw, optimise: Size}}
  - ethos-u55-64
  - ethos-u85-256
pipeline: default
quantization: {per_channel: true, method: minmax}
verify: {tosa: true, samples: 4}
"""


@pytest.fixture(scope="module")
def kws_build(tmp_path_factory) -> Path:
    """One DS-CNN build for all tests here (Vela and the simulator are the slow parts)."""
    import shutil

    from npbtest import REPO, run_subprocess

    root = tmp_path_factory.mktemp("npusim") / "product"
    (root / "configs" / "models").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    (root / "configs" / "kws.yaml").write_text(SPEC)
    shutil.copy(REPO / "configs" / "models" / "ds_cnn.onnx", root / "configs" / "models" / "ds_cnn.onnx")
    proc = run_subprocess(["build", "configs", "--build-dir", "build"], root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root / "build"


def _builds(build_dir: Path) -> dict[str, dict]:
    return {b["target"]: b for b in read_report(build_dir)["builds"]}


def test_ds_cnn_bitexact_on_u55_u65_u85_and_size_builds(kws_build):
    builds = _builds(kws_build)
    for target in ("u55-raw", "u55-size", "u65-raw", "u85-raw", "u85-2048-size"):
        assert builds[target]["status"] == "passed"
        assert builds[target]["stages"]["npu-sim"]["status"] == "passed"
        assert builds[target]["metrics"]["npusim_bitexact"] is True
        result = json.loads((Path(builds[target]["artifacts"]["vela"]).parents[2] / "npu-sim").glob(
            f"ds_cnn-{target}-*/npusim.json").__next__().read_text())
        assert result["bitexact"] is True and result["samples"] == 4 and result["npu_ops"] >= 10
        assert all(m["elements"] == 0 and m["of"] == 48 for m in result["mismatches"].values())


def test_tflite_builds_run_npu_sim_on_the_deployed_tflite(kws_build):
    """The default output format: npu-sim runs the .tflite's ethos-u operator, bit-exact like the raw builds."""
    builds = _builds(kws_build)
    for target in ("ethos-u85-256", "ethos-u55-64"):
        assert builds[target]["stages"]["npu-sim"]["status"] == "passed", builds[target]["stages"]["npu-sim"]
        assert builds[target]["metrics"]["npusim_bitexact"] is True
        assert builds[target]["status"] == "passed"
        assert Path(builds[target]["artifacts"]["vela"]).suffix == ".tflite"


def _artifacts(build: dict):
    npz = Path(build["artifacts"]["vela"])
    tosa = Path(build["artifacts"]["tosa"])
    io = LowerRecord.read(tosa.parent / "io.json")
    rng = np.random.default_rng(5)
    samples = [[io.inputs[0].to_tosa(rng.uniform(-1, 1, (1, 1, 49, 10)).astype(np.float32))] for _ in range(4)]
    return load_raw(npz), tosa.read_bytes(), io, samples


@pytest.mark.parametrize("target", ["u55-raw", "u85-raw"])
def test_corrupted_weight_byte_is_reported_with_its_op(kws_build, target):
    model, tosa, io, samples = _artifacts(_builds(kws_build)[target])
    names = [o.onnx_name for o in io.outputs]
    assert compare(model, tosa, samples, names).bitexact
    cmds = decode(model.commands, commands=COMMANDS if model.generation == "u85" else U55)
    npu = [c for c in cmds if c.kind != "DMA_START"]
    # the first 1x1 CONV, whose weights are DMA'd from flash (a standard-format stream on both)
    k = next(i for i, c in enumerate(npu) if c.kind == "CONV" and c.regs["KERNEL_WIDTH_M1"] == 0)
    op = npu[k]
    base = op.addr("WEIGHT_BASE")
    dma = [c for c in cmds if c.kind == "DMA_START" and c.index < op.index
           and c.addr("DMA0_DST") <= base < c.addr("DMA0_DST") + c.addr("DMA0_LEN")][-1]
    src = dma.addr("DMA0_SRC") + base - dma.addr("DMA0_DST") + op.regs["WEIGHT_LENGTH"] // 2
    weights = bytearray(model.weights)
    weights[src] ^= 0x01
    model.weights = bytes(weights)
    verdict = compare(model, tosa, samples, names)
    assert not verdict.bitexact and verdict.mismatches[names[0]] > 0
    assert verdict.first_bad_op is not None and verdict.first_bad_op.op == k
    assert verdict.first_bad_op.kind == "CONV" and f"NPU op #{k} CONV" in verdict.first_bad_op.describe()


@pytest.mark.parametrize("target", ["u55-raw", "u85-raw", "u85-2048-size"])
def test_samples_run_together_give_what_each_gives_alone(kws_build, target):
    """npu-sim runs a stage's samples in one pass over the command stream (memory with a sample axis), on U55
    and U85: each sample's outputs and every op's OFM are what running it alone gives."""
    model, _, _, samples = _artifacts(_builds(kws_build)[target])
    together = run_samples(model, samples)
    assert len(together) == len(samples)
    for xs, got in zip(samples, together, strict=True):
        alone = run(model, xs)
        assert all(np.array_equal(a, b) for a, b in zip(alone.outputs, got.outputs, strict=True))
        assert len(alone.ops) == len(got.ops) > 0
        assert all(b.ofm.ndim == 3 and np.array_equal(a.ofm, b.ofm) for a, b in zip(alone.ops, got.ops, strict=True))
    assert not all(np.array_equal(together[0].outputs[0], r.outputs[0]) for r in together[1:])  # samples differ


def test_simulate_command_lists_ops_and_prints_outputs(kws_build, capsys, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(1).uniform(-1, 1, (1, 1, 49, 10)).astype(np.float32))
    code, out, _ = run_cli(["simulate", str(kws_build), "--build", "u55-raw", "--input", str(x)], capsys)
    assert code == 0
    assert "ethos-u55-128" in out and "DEPTHWISE" in out and "NHCWB16" in out and "gemm_86_out: shape [1, 12]" in out
    # ops are traced to their TOSA tensor and Vela's per-layer cycle estimate for it (an op writing a stripe of
    # rows of a tensor, as the U55 stem conv on its space-to-depth view does, maps to none: "-")
    convs = [ln for ln in out.splitlines() if " CONV " in ln]
    traced = [m for m in (re.search(r" NHCWB16 +(layer-\d+) +(\d+) ", ln) for ln in convs) if m]
    assert len(traced) >= 4 and all(int(m.group(2)) > 0 for m in traced), out
    # a tflite build: simulate runs the ethos-u operator of Vela's .tflite (the only artifact such a build has)
    code, out, _ = run_cli(["simulate", str(kws_build), "--build", "ethos-u55-64", "--input", str(x)], capsys)
    assert code == 0 and "ethos-u55-64" in out and "gemm_86_out" in out
    # U85 artifacts (raw and tflite builds): ops traced to the TOSA graph the same way
    for target in ("u85-raw", "ethos-u85-256"):
        code, out, _ = run_cli(["simulate", str(kws_build), "--build", target, "--input", str(x)], capsys)
        assert code == 0 and "ethos-u85-256" in out and "gemm_86_out: shape [1, 12]" in out
        traced = [ln for ln in out.splitlines() if re.search(r" (CONV|DEPTHWISE) .* layer-\d+ +\d+ ", ln)]
        assert len(traced) >= 5, out
    code, _, err = run_cli(["simulate", str(kws_build), "--build", "nosuch"], capsys)
    assert code == 2 and "no build with a Vela artifact" in err and "matching 'nosuch'" in err
    code, _, err = run_cli(["simulate", str(kws_build)], capsys)
    assert code == 2 and "several builds" in err and err.count("\n") == 1
    code, _, err = run_cli(["simulate", str(x)], capsys)
    assert code == 2 and err.startswith(str(x))
