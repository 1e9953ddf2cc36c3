"""A build the host runs says so (report/status.py): status `passed (host only)` or `passed (mostly host)`, no
NPU figures measured as 0 (null), no SNR for comparisons not made (null, not 200 dB), and a warning naming the
nodes that put the work on the host. Silero VAD's opset-18 export (one If around the whole network) was
reported `passed`, 0 NPU ops, 0.000 ms, SRAM 0, TOSA and quant SNR 200 dB, with nothing compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from npbtest import read_report, run_cli
from onnx import TensorProto, helper, numpy_helper

from npubuild.report.regress import compare
from npubuild.report.status import Status, host_warning, placement_status, worse_status


def wholly_gated_model() -> onnx.ModelProto:
    """All the work inside one If on an input flag, a branch holding an If of its own (no select joins them)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32), "w")
    vi = helper.make_tensor_value_info
    inner = helper.make_node("If", ["flag"], ["picked"], name="inner", then_branch=helper.make_graph(
        [helper.make_node("Relu", ["h"], ["r"], name="act")], "t", [], [vi("r", TensorProto.FLOAT, [1, 8])]),
        else_branch=helper.make_graph([helper.make_node("Neg", ["h"], ["n"], name="neg")], "e", [],
                                      [vi("n", TensorProto.FLOAT, [1, 8])]))
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"), inner], "then", [],
                               [vi("picked", TensorProto.FLOAT, [1, 8])])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h2"], name="fc2")], "else", [],
                               [vi("h2", TensorProto.FLOAT, [1, 8])])
    graph = helper.make_graph([helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g,
                                                name="node_cond__1")], "vad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16]),
                               helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cortex_a_target(project: Path, base: str, monkeypatch) -> str:
    """A project profile of `base` whose host is a Cortex-A: its host partitions run in onnxruntime (TFLite Micro
    cannot run an If, so on a Cortex-M these models are one 'not deployable' line: tests/deploy)."""
    (project / "pyproject.toml").write_text("")
    (project / "targets").mkdir()
    name = f"{base}-linux"
    (project / "targets" / f"{name}.yaml").write_text(f"extends: {base}\nhost: {{kind: cortex-a, cpu: cortex-a55}}\n")
    monkeypatch.chdir(project)
    return name


def test_a_model_the_host_runs_whole_is_reported_as_such(tmp_path: Path, capsys, monkeypatch):
    path = tmp_path / "vad.onnx"
    onnx.save(wholly_gated_model(), path)
    target = cortex_a_target(tmp_path, "ethos-u55-128", monkeypatch)
    code, out, err = run_cli(["compile", str(path), "--target", target, "--build-dir", str(tmp_path / "b")], capsys)
    assert code == 0, out + err  # it built, and its figures are true: a gate (npu_offload) would fail it
    report_dir = tmp_path / "b" / "compile"
    (build,) = read_report(report_dir)["builds"]
    m = build["metrics"]
    assert build["status"] == "passed (host only)" and m["npu_offload"] == 0.0
    assert m["cpu_ops"] == 6  # the If and the five nodes its branches hold
    for metric in ("inference_ms", "npu_cycles", "sram_kib", "macs", "tosa_snr_db", "tosa_max_error_lsb", "quant_snr_db"):
        assert m[metric] is None, metric
    (warning,) = build["warnings"]
    assert "most of the model runs on the host" in warning and "If 'node_cond__1' (control-flow" in warning
    assert "condition depends on the data" in warning and "holds control flow of its own" in warning
    assert f"warnings (1):\n  warning: adhoc/vad/{target}: {warning}\n" in out
    assert "1 passed (1 host only, 0 mostly host)" in out
    md = (report_dir / "report.md").read_text()
    assert "| passed (host only) |" in md and "## Warnings" in md
    assert "passed (host only)" in (report_dir / "report.html").read_text()
    # `npubuild report` counts it as the pass it is, not as a build that did not pass
    code, out, err = run_cli(["report", "--build-dir", str(report_dir)], capsys)
    assert code == 0, err
    assert out.startswith("1 builds: 1 passed (1 host only, 0 mostly host), 0 failed, 0 skipped")
    assert "PASSED" not in out and "None" not in out


def test_statuses_by_placement_and_their_regressions():
    assert placement_status({"npu_partitions": 0, "npu_offload": 0.0}) == Status.HOST_ONLY
    assert placement_status({"npu_partitions": 2, "npu_ops": 4, "npu_offload": 0.4}) == Status.MOSTLY_HOST
    assert placement_status({"npu_partitions": 1, "npu_ops": 9, "npu_offload": 0.9}) == Status.PASSED
    assert worse_status("passed", "passed (mostly host)") and worse_status("passed (mostly host)", "failed")
    assert not worse_status("failed", "passed (host only)") and not worse_status("passed (host only)", "passed (host only)")
    assert host_warning({"npu_offload": 0.6}, 0.5) is None and host_warning({"npu_offload": 0.1}, None) is None
    tail = {"npu_offload": 0.43, "host_macs": 65792, "macs": 2633440,
            "offloads": [{"kind": "cpu", "op_type": "MatMul", "node": "mel", "rule": "kept-float", "reason": "float"}]}
    assert "1 on the host; the host 2.4% of its multiply-accumulates)" in host_warning(tail, 0.5)
    assert "1 on the host)" in host_warning({**tail, "host_macs": None}, 0.5)
    old = {"builds": [{"spec": "s", "model": "m", "target": "t", "status": "passed", "metrics": {}}]}
    new = {"builds": [{"spec": "s", "model": "m", "target": "t", "status": "passed (host only)", "metrics": {},
                       "warnings": ["most of the model runs on the host"]}]}
    (reg,) = compare(new, old, {}).regressions
    assert reg.metric == "status" and "most of the model runs on the host" in reg.line()


def test_an_output_whose_shape_the_data_decides_builds_on_the_host(tmp_path: Path, capsys, monkeypatch):
    """Branches of different shapes on an input flag: the samples' outputs differ in shape (was: internal error,
    'all the input array dimensions except for the concatenation axis must match'). onnxruntime runs it, so
    npubuild does: on the host, compared element by element."""
    model = wholly_gated_model()
    gate = model.graph.node[0]
    else_g = next(a for a in gate.attribute if a.name == "else_branch").g
    else_g.node[0].CopyFrom(helper.make_node("Identity", ["x"], ["h2"], name="same"))
    else_g.output[0].CopyFrom(helper.make_tensor_value_info("h2", TensorProto.FLOAT, [1, 16]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"]))
    path = tmp_path / "shapes.onnx"
    onnx.save(model, path)
    target = cortex_a_target(tmp_path, "ethos-u85-256", monkeypatch)
    code, out, err = run_cli(["compile", str(path), "--target", target, "--build-dir", str(tmp_path / "b")], capsys)
    (build,) = read_report(tmp_path / "b" / "compile")["builds"]
    assert code == 0 and build["status"] == "passed (host only)", out + err
