"""Acceptance: an op U55 cannot run but U85 can builds for both; on U55 the model is split into NPU and host
partitions, with the reason; on U85 it is one NPU partition; the partitioned model matches onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from npbtest import read_report, run_cli
from npbtest.builds import add_compare_model
from npbtest.ops import run_onnx

from npubuild.records.lower import LowerRecord
from npubuild.verify.partitioned import PartitionedModel


def _io(build_dir: Path) -> tuple[Path, LowerRecord]:
    io_path = next((build_dir / "stages" / "lower").glob("m-*/io.json"))
    return io_path.parent, LowerRecord.read(io_path)


def test_u55_splits_into_npu_and_host_partitions_and_u85_runs_one(project: Path, capsys):
    spec = add_compare_model(project)
    build_dir = project / "build"
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(build_dir), "-q"], capsys)
    assert code == 0, err
    builds = {b["target"]: b for b in read_report(build_dir)["builds"]}
    u55, u85 = builds["ethos-u55-128"]["metrics"], builds["ethos-u85-256"]["metrics"]
    assert u85["npu_partitions"] == 1 and u85["host_ops"] == 0 and u85["cpu_ops"] == 0
    assert u55["npu_partitions"] == 2 and u55["host_ops"] == 2 and u55["cpu_ops"] == 2 and u55["npu_ops"] == 3
    cpu = {p["node"]: p for p in u55["offloads"] if p["kind"] == "cpu"}
    assert set(cpu) == {"gt", "sel"}
    assert u55["host_macs"] == 0 and cpu["gt"]["macs"] == 0  # a comparison and a select: no multiply-accumulates
    assert u85["host_macs"] == 0 and "macs" not in u85["offloads"][0]  # nothing on the host; NPU nodes say none
    assert cpu["gt"]["rule"] == "u55-op-type" and "GREATER" in cpu["gt"]["reason"]
    assert "SELECT" in cpu["sel"]["reason"]
    kinds = [p["kind"] for p in u55["partition_graph"]]
    assert kinds == ["npu", "host", "npu"]
    # each NPU partition was compiled by Vela on its own, fully on the NPU
    assert u55["vela_cpu_ops"] == 0 and len(u55["firmware"]) == 2
    vela_dir = Path(builds["ethos-u55-128"]["artifacts"]["vela"]).parent
    deployment = json.loads((vela_dir / u55["firmware"][0]["manifest"]).parent.joinpath(
        "npubuild_deployment.json").read_text())
    assert [(p["kind"], p.get("prefix"), p.get("onnx")) for p in deployment["partitions"]] == [
        ("npu", "npubuild_u55_part0", None), ("host", None, "u55_host1.onnx"), ("npu", "npubuild_u55_part2", None)]
    md = (build_dir / "report.md").read_text()
    assert "| gt | Greater | 1 |" in md and "u55-op-type" in md

    # the partitioned model (NPU parts on the TOSA reference model, host parts on onnxruntime) vs onnxruntime
    lower_dir, io = _io(build_dir)
    record = io.families["u55"]
    host = [p for p in record.partitions if p.kind == "host"]
    assert host and all(onnx.load(str(lower_dir / p.file)).graph.node for p in host)
    qdq = next((build_dir / "stages" / "quantize").glob("m-*/model_qdq.onnx"))
    rng = np.random.default_rng(7)
    spec_out = io.outputs[0]
    worst = 0.0
    for _ in range(4):
        x = rng.uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
        got = PartitionedModel(lower_dir, record.partitions, io.outputs)({"x": x})["y"]
        ref = run_onnx(str(qdq), {"x": x})["y"]
        worst = max(worst, float(np.max(np.abs(spec_out.quantize_reference(ref) - got.astype(np.float64)))))
    assert worst <= 1.0
    assert record.max_error_lsb <= 1.0
    # and the TOSA check ran it on the spec's verify samples
    numerics = json.loads(next((build_dir / "stages" / "tosa-check").glob("m-*/numerics.json")).read_text())
    assert set(numerics["partitioned"]) == {"u55"}  # the targets' families; U85 runs model.tosa whole
    assert numerics["partitioned"]["u55"]["samples"] == 4 and numerics["partitioned"]["u55"]["max_error_lsb"] <= 1.0
    assert u55["deployed_max_error_lsb"] == numerics["partitioned"]["u55"]["max_error_lsb"]
    assert u85["deployed_max_error_lsb"] == u85["tosa_max_error_lsb"]


def test_partition_gates(project: Path, capsys):
    spec = add_compare_model(project, targets="[ethos-u55-128]", expect="{npu_partitions: 1, host_ops: 0}")
    code, _, _ = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 1
    gates = {g["name"]: g for g in read_report(project / "build")["builds"][0]["gates"]}
    assert gates["npu_partitions"]["value"] == 2 and not gates["npu_partitions"]["ok"]
    assert gates["host_ops"]["value"] == 2 and not gates["host_ops"]["ok"]

    spec = add_compare_model(project, targets="[ethos-u55-128]",
                             expect="{npu_partitions: 2, host_ops: 2, max_deployed_error_lsb: 1}")
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(project / "build"), "-q"], capsys)
    assert code == 0, err
    gates = {g["name"]: g for g in read_report(project / "build")["builds"][0]["gates"]}
    # the spec's three, and the int profile's default collapse gate (config/metrics.DEFAULT_GATES)
    assert set(gates) == {"npu_partitions", "host_ops", "max_deployed_error_lsb", "max_collapsed_outputs"}
    assert all(g["ok"] for g in gates.values()) and gates["max_collapsed_outputs"]["default"]


def test_an_npu_partition_is_never_only_the_q_dq_of_graph_inputs():
    """Inputs a (read only by a host node) and b (read by an NPU node that also waits for the host): with only
    Q/DQ ready, the host partition goes first, so b's Q/DQ joins the NPU node's partition; an NPU partition of
    nothing but b's Q/DQ would have the graph input as its output, which no TOSA graph can compute."""
    from npubuild.ethosu.partition import group

    def qdq(t: str) -> list[onnx.NodeProto]:
        return [onnx.helper.make_node("QuantizeLinear", [t, "s", "z"], [f"{t}_q"], name=f"{t}_Q"),
                onnx.helper.make_node("DequantizeLinear", [f"{t}_q", "s", "z"], [f"{t}_dq"], name=f"{t}_DQ")]

    nodes = [*qdq("b"), *qdq("a"), onnx.helper.make_node("Loop", ["a_dq"], ["h"], name="host_node"),
             onnx.helper.make_node("Add", ["b_dq", "h"], ["y"], name="npu_node")]
    f = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info(t, f, [4]) for t in "ab"],
                                   [onnx.helper.make_tensor_value_info("y", f, [4])],
                                   [onnx.numpy_helper.from_array(np.array(0.1, np.float32), "s"),
                                    onnx.numpy_helper.from_array(np.array(0, np.int8), "z")])
    labels = {"b_Q": "npu", "b_DQ": "npu", "a_Q": "host", "a_DQ": "host", "host_node": "host", "npu_node": "npu"}
    parts = group(onnx.helper.make_model(graph), labels)
    assert [(p.kind, [n.name for n in p.nodes]) for p in parts] == [
        ("host", ["a_Q", "a_DQ", "host_node"]), ("npu", ["b_Q", "b_DQ", "npu_node"])]
    assert parts[1].inputs == ["b", "h"] and parts[1].outputs == ["y"]
