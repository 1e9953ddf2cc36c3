"""tosa-check on every kind of output: shapes compared first (one line), bool and rank-0 outputs, NaN/inf by
position, bfloat16; and a failed build still reports what its finished stages measured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from npbtest import REPO, read_report, run_cli
from npbtest.builds import conv_chain_model, write_spec
from onnx import TensorProto, helper, numpy_helper

from npubuild.verify.numerics import compare_output

ERROR_LINE = "error: "


def _model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name: str, elem: int, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _build(project: Path, capsys, model: onnx.ModelProto, shape: list[int], pipeline: str = "fp",
           targets: str = "[ethos-u85-256]", expect: str = "{}") -> tuple[int, str, dict]:
    onnx.save(model, project / "configs" / "models" / "m.onnx")
    spec = write_spec(project, "t", "m.onnx", shape, targets, expect, extra=f"pipeline: {pipeline}\n")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    builds = read_report(project / "build")["builds"]
    return code, err, builds[0]


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ERROR_LINE in ln]


def _lower_dir(project: Path) -> Path:
    return next((project / "build" / "stages" / "lower").glob("m-*/io.json")).parent


def _reduce_model(keepdims: int) -> onnx.ModelProto:
    return _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=keepdims, name="rs")],
                  [_vi("x", TensorProto.FLOAT, [1, 4, 3])], [_vi("y", TensorProto.FLOAT, [1, 4, 1] if keepdims else [1, 4])],
                  [numpy_helper.from_array(np.array([2], np.int64), "axes")])


def _build_with_wrong_lowering(project: Path, tmp_path: Path, module: str, op: str, wrong: str) -> tuple[int, str]:
    """`npubuild build` of the spec in configs/t.yaml by a copy of npubuild whose `op` lowering is replaced by a
    deliberately wrong one: `wrong` is the body of `_wrong(ctx)`, which can call the real lowering as `_right`.
    (The build's own stage outputs cannot be edited instead: a changed output makes its stage run again.)
    Returns the exit code and stderr; the report goes to build-wrong/."""
    src = tmp_path / "wrong-src"
    shutil.copytree(REPO / "npubuild", src / "npubuild", ignore=shutil.ignore_patterns("__pycache__"))
    for d in ("targets", "pipelines"):  # what the shipped root holds beside the package
        shutil.copytree(REPO / d, src / d)
    body = "\n".join(f"    {line}" for line in wrong.strip().splitlines())
    with open(src / "npubuild" / "lowering" / "ops" / module, "a") as f:
        f.write(f"\n\nfrom npubuild.lowering.registry import LOWERINGS as _LOWERINGS\n_right = _LOWERINGS.pop({op!r})\n\n\n"
                f"@lowers({op!r})\ndef _wrong(ctx):\n{body}\n")
    env = {k: v for k, v in os.environ.items() if k != "NPUBUILD_CACHE"} | {"PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-m", "npubuild", "build", str(project / "configs" / "t.yaml"),
                           "--build-dir", str(project / "build-wrong"), "--cache", "off", "-q"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stderr


def test_an_output_of_the_wrong_shape_fails_the_check_with_one_line(project: Path, tmp_path: Path, capsys):
    code, err, b = _build(project, capsys, _reduce_model(keepdims=1), [1, 4, 3])
    assert code == 0, err
    # a ReduceSum lowering that drops the kept axis: [1, 4] broadcasts against [1, 4, 1] and was compared silently
    wrong = """
for a in ctx.current.attribute:
    if a.name == "keepdims":
        a.i = 0
_right(ctx)
"""
    code, err = _build_with_wrong_lowering(project, tmp_path, "reduce.py", "ReduceSum", wrong)
    assert code == 1, err
    (line,) = _errors(err)
    assert "output 'y': the TOSA graph gives shape [1, 4] where onnxruntime gives [1, 4, 1]" in line
    b = read_report(project / "build-wrong")["builds"][0]
    assert b["stages"]["tosa-check"]["status"] == "failed" and b["error_kinds"] == ["stage"]
    assert b["stages"]["lower"]["status"] == "passed"


def test_bool_outputs_are_compared_element_for_element(project: Path, capsys):
    w = numpy_helper.from_array(np.random.default_rng(0).uniform(-1, 1, (4, 4, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Greater", ["c", "t"], ["y"], name="gt")]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 4, 4, 4])], [_vi("y", TensorProto.BOOL, [1, 4, 4, 4])],
                   [w, numpy_helper.from_array(np.array(0.1, np.float32), "t")])
    for pipeline in ("fp", "default"):  # FP, and INT with Greater on the U85 NPU
        code, err, b = _build(project, capsys, model, [1, 4, 4, 4], pipeline)
        assert code == 0, err
        out = b["metrics"]["outputs"]["y"]
        assert out["mismatched_elements"] == 0 and out["max_abs_error"] == 0.0
        assert b["metrics"]["io"]["outputs"][0]["dtype"] == "bool"
    assert b["metrics"]["tosa_max_error_lsb"] == 0.0 and b["metrics"]["host_ops"] == 0


def test_rank0_outputs_in_fp_and_int(project: Path, capsys):
    rng = np.random.default_rng(1)
    models = {
        "matmul": _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [_vi("x", TensorProto.FLOAT, [8])],
                         [_vi("y", TensorProto.FLOAT, [])],
                         [numpy_helper.from_array(rng.uniform(-1, 1, 8).astype(np.float32), "w")]),
        "reduce": _model([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0, name="rs")],
                         [_vi("x", TensorProto.FLOAT, [8])], [_vi("y", TensorProto.FLOAT, [])]),
    }
    for name, model in models.items():
        for pipeline in ("fp", "default"):
            code, err, b = _build(project, capsys, model, [8], pipeline)
            assert code == 0, (name, pipeline, err)
            m = b["metrics"]
            assert m["io"]["outputs"][0]["onnx_shape"] == [], name
            assert m["tosa_snr_db"] > 30, (name, pipeline)
            if pipeline == "default":
                assert m["tosa_max_error_lsb"] <= 1, name


def _div_model(divisor: list[float]) -> onnx.ModelProto:
    """x / c with zeros in c: +-inf where x != 0 (and NaN where x is 0, never for these inputs)."""
    return _model([helper.make_node("Div", ["x", "c"], ["y"], name="div")], [_vi("x", TensorProto.FLOAT, [1, 4])],
                  [_vi("y", TensorProto.FLOAT, [1, 4])],
                  [numpy_helper.from_array(np.array([divisor], np.float32), "c")])


def test_nonfinite_outputs_match_by_position_and_report_json_has_no_nan(project: Path, tmp_path: Path, capsys):
    code, err, b = _build(project, capsys, _div_model([2.0, 0.0, 4.0, 0.0]), [1, 4])
    assert code == 0, err
    out = b["metrics"]["outputs"]["y"]
    assert out["nonfinite"] == 2 * 4 and out["nonfinite_mismatches"] == 0  # 2 per sample, 4 samples
    assert out["max_abs_error"] < 1e-6 and b["metrics"]["tosa_snr_db"] > 100  # the finite half, by value
    json.loads((project / "build" / "report.json").read_text(),
               parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(f"{c} in report.json")))
    # a Div lowering that reads the divisor backwards [0, 4, 0, 2]: its infinities sit elsewhere, which fails the
    # build with one line (4 positions differ per sample, 4 samples)
    wrong = """
divisor = ctx.current.input[1]
ctx.values[divisor] = ctx.values[divisor][..., ::-1].copy()
_right(ctx)
"""
    code, err = _build_with_wrong_lowering(project, tmp_path, "elementwise.py", "Div", wrong)
    assert code == 1, err
    (line,) = _errors(err)
    assert "NaN/inf where onnxruntime has none" in line and "'y' 16 elements" in line


def test_compare_output_leaves_nonfinite_out_of_the_measures():
    ref = np.array([[1.0, np.inf, np.nan, -np.inf, 2.0]])
    same = compare_output(ref, ref.copy())
    assert same["nonfinite"] == 3 and same["nonfinite_mismatches"] == 0 and same["max_abs_error"] == 0.0
    moved = compare_output(ref, np.array([[1.0, np.nan, np.inf, -np.inf, 2.5]]))
    assert moved["nonfinite_mismatches"] == 2 and moved["max_abs_error"] == 0.5
    assert all(np.isfinite(v) for v in moved.values() if isinstance(v, float))


def test_bfloat16_output_is_checked_as_float(project: Path, capsys):
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["y"], to=TensorProto.BFLOAT16, name="to_bf16")]
    model = _model(nodes, [_vi("x", TensorProto.FLOAT, [1, 16])], [_vi("y", TensorProto.BFLOAT16, [1, 16])])
    code, err, b = _build(project, capsys, model, [1, 16])
    assert code == 0, err
    m = b["metrics"]
    # the narrowing Cast runs on the host (onnxruntime, bfloat16 read back as float32); Relu on the NPU graph
    assert m["outputs"]["y"]["max_abs_error"] == 0.0 and m["tosa_snr_db"] == 200.0
    lower = json.loads((_lower_dir(project) / "io.json").read_text())
    assert [p["kind"] for p in lower["portable"]["partitions"]] == ["npu", "host"]


def _cos_model() -> onnx.ModelProto:
    return _model([helper.make_node("Cos", ["x"], ["y"], name="my_cos")], [_vi("x", TensorProto.FLOAT, [1, 8])],
                  [_vi("y", TensorProto.FLOAT, [1, 8])])


def test_a_model_that_runs_wholly_on_the_host_skips_npu_sim_with_a_reason(project: Path, capsys):
    targets = "[{extends: ethos-u55-128, name: u55-raw, vela: {output_format: raw}}]"
    code, err, b = _build(project, capsys, _cos_model(), [1, 8], "default", targets)
    assert code == 0, err
    sim = b["stages"]["npu-sim"]
    assert sim["status"] == "skipped" and "every node runs on the host" in sim["reason"]
    m = b["metrics"]
    assert m["npu_partitions"] == 0 and m["host_ops"] == 1 and m["npu_offload"] == 0.0
    assert m["offloads"][0]["rule"] == "no-lowering"
    # onnxruntime was compared with itself: no TOSA figure (was 0 LSB, 200 dB), and the status says where it runs
    assert m["tosa_max_error_lsb"] is None and m["tosa_snr_db"] is None and b["status"] == "passed (host only)"
    assert "tosa" not in b["artifacts"]  # no single TOSA graph: the partitions stand for it


def test_a_build_whose_vela_stage_fails_still_reports_placement_and_numerics(project: Path, capsys):
    # 2 KiB holds the arena's lower bound the import stage checks (input and output whole: 1 + 1 KiB), so the
    # build gets past import, lower and tosa-check; Vela then needs more (the intermediates) and fails the pool
    targets = "[{extends: ethos-u55-128, name: u55-tiny, pools: {sram: {size_kib: 2}}}]"
    code, err, b = _build(project, capsys, conv_chain_model(16, 8), [1, 4, 16, 16], "default", targets)
    assert code == 1
    assert b["status"] == "failed" and b["stages"]["vela"]["status"] == "failed" and b["error_kinds"] == ["stage"]
    assert "pool 'sram'" in b["errors"][0]
    assert all(b["stages"][s]["status"] == "passed" for s in ("import", "quantize", "lower", "tosa-check"))
    m = b["metrics"]
    assert m["tosa_snr_db"] > 30 and m["tosa_max_error_lsb"] <= 1  # tosa-check finished: its numbers
    assert {"conv0", "conv1", "conv2"} <= {p["node"] for p in m["offloads"]}
    assert all(p["kind"] == "npu" for p in m["offloads"])
    assert m["npu_partitions"] == 1 and m["host_ops"] == 0 and m["npu_offload"] == 1.0
    assert m["sram_kib"] is None and m["inference_ms"] is None  # Vela did not finish: nothing from it
    md = (project / "build" / "report.md").read_text()
    assert "u55-tiny" in md
