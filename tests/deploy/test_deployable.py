"""One deployable .tflite per build: the host_fallback example (an int8 LRN on the host between two NPU partitions)
becomes a single flatbuffer with two ethos-u operators and TFLite builtins for the LRN; TensorFlow Lite Micro
runs its host operators within 1 LSB of onnxruntime's host partition; the virtual device's output matches the
whole QDQ model within the partitioned check's bound; the manifest says what runs each partition and its arena.
A host op with no TFLite builtin fails a Cortex-M target and runs in onnxruntime on a Cortex-A one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from npbtest import REPO, read_report, run_cli
from npbtest.builds import custom_op_model

from npubuild.deploy.virtual_device import HostRun, VirtualDevice
from npubuild.models.zoo import alexnet_lrn
from npubuild.npusim.tflite import load_tflite, npu_operators
from npubuild.records.lower import LowerRecord

TARGETS = "[ethos-u55-128, {extends: ethos-u85-256, name: u85-raw, vela: {output_format: raw}}]"


def _stage_dir(build: Path, stage: str, label: str) -> Path:
    return next((build / "stages" / stage).glob(f"{label}-*"))


def test_host_fallback_deploys_as_one_tflite(project: Path, capsys):
    spec = project / "configs" / "host_fallback.yaml"
    shutil.copy(REPO / "configs" / "host_fallback.yaml", spec)
    onnx.save(alexnet_lrn(), project / "configs" / "models" / "alexnet_lrn.onnx")
    spec.write_text(spec.read_text().replace("targets: [ethos-u55-128, ethos-u85-256]", f"targets: {TARGETS}"))
    build = project / "build"
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(build), "-q"], capsys)
    assert code == 0, err
    lower_dir = _stage_dir(build, "lower", "alexnet_lrn")
    io = LowerRecord.read(lower_dir / "io.json")
    for b in read_report(build)["builds"]:
        m = b["metrics"]
        assert b["status"] == "passed" and m["npusim_bitexact"] is True and m["cortex_m_deployable"] is True
        assert m["device_max_error_lsb"] is not None and m["device_max_error_lsb"] <= m["deployed_max_error_lsb"] + 1
        vela_dir = _stage_dir(build, "vela", f"alexnet_lrn-{b['target']}")
        data = (vela_dir / "firmware" / "npubuild_deployable.tflite").read_bytes()
        ops = npu_operators(data)
        assert len(ops) == 2  # both NPU partitions, Vela's ethos-u operators
        # the arena plan keeps each command stream's addressing: I/O at Vela's offsets from its scratch tensor
        for op, stem in zip(ops, ("part0", "part2"), strict=True):
            (vela_op,) = load_tflite(next(vela_dir.rglob(f"*_{stem}_vela.tflite")))
            assert op.model.weights == vela_op.weights and np.array_equal(op.model.commands, vela_op.commands)
            assert [(p.region, p.offset) for p in op.model.inputs + op.model.outputs] == \
                   [(p.region, p.offset) for p in vela_op.inputs + vela_op.outputs]

        # the manifest: per partition what runs it and its arena, the deployable's I/O quantisation
        manifest = json.loads((vela_dir / "firmware" / "npubuild_deployment.json").read_text())
        assert manifest["host"] == {"kind": "cortex-m", "cpu": "cortex-m55" if "u55" in b["target"] else "cortex-m85"}
        parts = manifest["partitions"]
        assert [p["runs_on"] for p in parts] == ["ethos-u", "tflite-micro", "ethos-u"]
        assert {"CONV_2D", "LOG", "EXP", "QUANTIZE", "DEQUANTIZE"} <= set(parts[1]["tflite_builtins"])
        assert all(p["arena_bytes"] > 0 for p in parts)
        deployable = manifest["deployable"]
        assert deployable["bytes"] == len(data) and deployable["tflm_host_arena_bytes"] == m["tflm_arena_bytes"] > 0
        assert deployable["inputs"][0]["scale"] > 0 and deployable["outputs"][0]["name"] == "gemm_16_out"
        source = (vela_dir / deployable["source"]).read_text()
        assert f"npubuild_deployable_len = {len(data)};" in source

        # TensorFlow Lite Micro runs the deployable's host operators: the LRN partition vs onnxruntime's
        device = VirtualDevice(data)
        (host,) = [s for s in device.steps if isinstance(s, HostRun)]
        fam = "u55" if "u55" in b["target"] else "u85"
        (part,) = [p for p in io.families[fam].partitions if p.kind == "host"]
        src = [p for p in io.families[fam].partitions if p.kind == "npu"][0].outputs_io[0]
        dst = [p for p in io.families[fam].partitions if p.kind == "npu"][1].inputs_io[0]
        session = ort.InferenceSession(str(lower_dir / part.file))
        rng = np.random.default_rng(1)
        for _ in range(3):
            codes = rng.integers(-128, 128, src.shape).astype(np.int8)
            host.interpreter.set_input(codes, 0)
            host.interpreter.invoke()
            got = np.asarray(host.interpreter.get_output(0)).astype(np.int64)
            ref = session.run(None, {src.onnx_name: src.dequantize(src.from_tosa(codes), np.float32)})[0]
            assert np.abs(dst.to_tosa(ref).astype(np.int64) - got.reshape(dst.shape)).max() <= 1

    # `npubuild simulate` on the whole build runs its deployable on the virtual device; a float input in ONNX
    # layout is quantised as the deployable's input is
    x = project / "x.npy"
    np.save(x, np.random.default_rng(2).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32))
    code, out, err = run_cli(["simulate", str(build), "--build", "ethos-u55-128", "--input", str(x)], capsys)
    assert code == 0, err
    assert "the deployable on the virtual device" in out and "TFLite Micro: operators" in out
    assert out.count("Ethos-U (npu-sim)") == 2 and "gemm_16_out: shape [1, 10]" in out
    tflite = _stage_dir(build, "vela", "alexnet_lrn-ethos-u55-128") / "firmware" / "npubuild_deployable.tflite"
    code, out, err = run_cli(["simulate", str(tflite)], capsys)
    assert code == 0 and "random input, seed 0" in out, err


def test_a_host_op_with_no_tflite_builtin_is_not_deployable_on_a_cortex_m(project: Path, capsys):
    onnx.save(custom_op_model("com.microsoft", "Trilu"), project / "configs" / "models" / "trilu.onnx")
    spec = project / "configs" / "trilu.yaml"
    spec.write_text("""version: 1
name: trilu
models:
  trilu: {path: models/trilu.onnx, calibration: {random: {samples: 8, seed: 0}}}
targets:
  - ethos-u65-256
  - {extends: ethos-u65-256, name: u65-linux, host: {kind: cortex-a, cpu: cortex-a55}}
""")
    build = project / "build"
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(build), "-q", "--keep-going"], capsys)
    assert code == 1
    builds = {b["target"]: b for b in read_report(build)["builds"]}
    m55 = builds["ethos-u65-256"]
    assert m55["status"] == "failed" and "stage" in m55["error_kinds"]
    assert "not deployable on a Cortex-M (cortex-m55): node 'my_foo' (Trilu)" in m55["stages"]["vela"]["error"]
    linux = builds["u65-linux"]
    assert linux["status"] == "passed" and linux["metrics"]["cortex_m_deployable"] is False
    manifest = json.loads((_stage_dir(build, "vela", "trilu-u65-linux") / "firmware" /
                           "npubuild_deployment.json").read_text())
    assert [p["runs_on"] for p in manifest["partitions"]] == ["ethos-u", "onnxruntime"]
    assert "Trilu" in manifest["partitions"][1]["not_deployable_on_cortex_m"]


def rate_gated_model() -> onnx.ModelProto:
    """Silero VAD's opset-18 export, small: an int64 sample-rate input picks one of two branches (`sr[0] == 16000`,
    a Reshape, a Gather of a constant position and an Equal); the import runs both and selects (a Where), the
    comparison on the host before the NPU partition, the select after it: a bool passes host to host."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32), "w16"),
             numpy_helper.from_array(rng.normal(size=(16, 8)).astype(np.float32), "w8"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat"),
             numpy_helper.from_array(np.array(0, np.int64), "first"),
             numpy_helper.from_array(np.array(16000, np.int64), "rate16k")]
    vi = helper.make_tensor_value_info
    branch = [helper.make_graph([helper.make_node("MatMul", ["x", w], [f"y{w}"], name=f"fc_{w}"),
                                 helper.make_node("Relu", [f"y{w}"], [f"r{w}"], name=f"relu_{w}")], w, [],
                                [vi(f"r{w}", TensorProto.FLOAT, [1, 8])]) for w in ("w16", "w8")]
    nodes = [helper.make_node("Reshape", ["sr", "flat"], ["rates"], name="node_Reshape_1"),
             helper.make_node("Gather", ["rates", "first"], ["rate"], name="node_Gather_3"),
             helper.make_node("Equal", ["rate", "rate16k"], ["eq_2"], name="node_eq_2"),
             helper.make_node("If", ["eq_2"], ["y"], name="node_cond__1", then_branch=branch[0],
                              else_branch=branch[1])]
    graph = helper.make_graph(nodes, "vad", [vi("x", TensorProto.FLOAT, [1, 16]), vi("sr", TensorProto.INT64, [1])],
                              [vi("y", TensorProto.FLOAT, [1, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_data_dependent_gate_on_an_integer_input_deploys_on_a_cortex_m(project: Path, capsys):
    """Was: an internal error (NotDeployable: 'eq_2' "a float host output") once the comparison's bool crossed from
    one host partition to the next, and then 'constant indices' for the Gather of `sr[0]`, on every Cortex-M
    target; TFLite Micro's GATHER takes no int32 table, so the constant position is a SLICE."""
    onnx.save(rate_gated_model(), project / "configs" / "models" / "vad.onnx")
    rng = np.random.default_rng(6)
    np.savez(project / "configs" / "vad_calib.npz", x=rng.normal(size=(8, 1, 16)).astype(np.float32),
             sr=np.array([16000, 8000] * 4, np.int64).reshape(8, 1))
    spec = project / "configs" / "vad.yaml"
    spec.write_text("version: 1\nname: vad\nmodels:\n  vad: {path: models/vad.onnx, calibration: {npy: vad_calib.npz}}"
                    "\ntargets: [ethos-u55-128]\nverify: {tosa: true, samples: 8}\n"
                    "expect: {max_device_error_lsb: 1}\n")
    build = project / "build"
    code, _, err = run_cli(["build", str(spec), "--build-dir", str(build), "-q"], capsys)
    assert code == 0, err
    (b,) = read_report(build)["builds"]
    m = b["metrics"]
    assert m["cortex_m_deployable"] is True and m["device_max_error_lsb"] is not None and m["device_max_error_lsb"] <= 1
    manifest = json.loads((_stage_dir(build, "vela", "vad-ethos-u55-128") / "firmware" /
                           "npubuild_deployment.json").read_text())
    parts = manifest["partitions"]
    assert [p["runs_on"] for p in parts] == ["tflite-micro", "ethos-u", "tflite-micro"]
    assert {"SLICE", "EQUAL"} <= set(parts[0]["tflite_builtins"]) and "SELECT_V2" in parts[2]["tflite_builtins"]
