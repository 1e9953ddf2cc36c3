"""`quantization.layers: {X: {activations: float}}`: layers kept in float on the host CPU, for what no integer grid
holds. The model: a log-power spectrum (a linear transform on the NPU, its square, a filterbank, a floor, a log),
whose power spans four decades between bands: on an int8 grid a faint band's power is a few levels, or none,
and its log far from float's. With the tail in float the build keeps float's figures, and the deployable (NPU command
stream in npu-sim, the host part in TensorFlow Lite Micro) computes what the checked model does."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest import read_report, run_cli
from onnx import TensorProto, helper, numpy_helper

from npubuild.cli import main
from npubuild.frontend.passes import HOST_REASON, KEPT_FLOAT
from npubuild.frontend.precision.choose import describe
from npubuild.frontend.precision.qdq import QdqModel
from npubuild.frontend.precision.rewrite import PrecisionPlan, apply_plan
from npubuild.frontend.quantize import quantize

TAIL = ("power", "mel", "floor", "log")


def log_power_model() -> onnx.ModelProto:
    """x [1, 64] -> MatMul [64, 64] (a DFT: 32 bins' cosine and sine parts) -> z*z -> MatMul [64, 8] (a filterbank
    adding each band's parts) -> Max 1e-3 -> Log."""
    n = np.arange(64)
    k = np.arange(32)
    angle = 2 * np.pi * np.outer(n, k) / 64
    dft = (np.concatenate([np.cos(angle), np.sin(angle)], axis=1) / 8).astype(np.float32)
    bank = np.zeros((64, 8), np.float32)
    for b in range(8):
        bank[4 * b:4 * b + 4, b] = bank[32 + 4 * b:32 + 4 * b + 4, b] = 1.0
    nodes = [helper.make_node("MatMul", ["x", "dft"], ["z"], name="transform"),
             helper.make_node("Mul", ["z", "z"], ["p"], name="power"),
             helper.make_node("MatMul", ["p", "bank"], ["m"], name="mel"),
             helper.make_node("Max", ["m", "eps"], ["c"], name="floor"),
             helper.make_node("Log", ["c"], ["y"], name="log")]
    inits = [numpy_helper.from_array(dft, "dft"), numpy_helper.from_array(bank, "bank"),
             numpy_helper.from_array(np.array(1e-3, np.float32), "eps")]
    graph = helper.make_graph(nodes, "logpower", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _inputs(n: int, seed: int) -> np.ndarray:
    """Two tones each, loud or faint (30 dB apart at most): the bands' power spans four decades, as a spectrum's
    does."""
    rng = np.random.default_rng(seed)
    t = np.arange(64)
    out = np.zeros((n, 1, 64))
    for i in range(n):
        for _ in range(2):
            out[i, 0] += 10 ** rng.uniform(-1.5, 0) * np.sin(2 * np.pi * rng.integers(1, 31) * t / 64 + rng.uniform(0, 6))
    return out.astype(np.float32)


SPEC = """version: 1
name: {name}
models:
  logpower:
    path: logpower.onnx
    calibration: {{npy: calib.npy}}
targets: [ethos-u55-128]
verify: {{samples: 4}}
"""
FLOAT_TAIL = "quantization:\n  layers:\n    transform: {activations: int16}\n" + \
    "".join(f"    {n}: {{activations: float}}\n" for n in TAIL)


AUTO_TAIL = "quantization:\n  precision: auto\n  budget: {min_snr_db: 40, host_float: true}\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("float_layers") / "product"
    (root / "configs").mkdir(parents=True)
    (root / "dodo.py").write_text("# product repo marker\n")
    onnx.save(log_power_model(), root / "configs" / "logpower.onnx")
    np.save(root / "configs" / "calib.npy", _inputs(24, 0))
    (root / "configs" / "int8.yaml").write_text(SPEC.format(name="int8"))
    (root / "configs" / "tail.yaml").write_text(SPEC.format(name="tail") + FLOAT_TAIL)
    (root / "configs" / "auto.yaml").write_text(SPEC.format(name="auto") + AUTO_TAIL)
    old = Path.cwd()
    os.chdir(root)  # run_cli's way, without capsys (function-scoped): the tests read the report
    try:
        code = main(["build", "--build-dir", "b", "--keep-going", "-q"])
    finally:
        os.chdir(old)
    assert code == 0
    return root, {b["spec"]: b for b in read_report(root / "b")["builds"]}


def test_the_float_tail_keeps_what_int8_loses(built):
    _, builds = built
    int8, tail = builds["int8"]["metrics"], builds["tail"]["metrics"]
    assert builds["tail"]["status"] == "passed (mostly host)", builds["tail"].get("errors")  # 4 of 5 nodes
    # measured: int8 21.6 dB, the transform in int16 and the tail in float 49.1 dB (held-back rows, the device)
    assert tail["float_snr_db"] > 40 and tail["float_snr_db"] > int8["float_snr_db"] + 20
    assert tail["float_engine"] == "virtual-device"


def test_the_tail_runs_on_the_host_and_the_deployable_computes_the_checked_model(built):
    root, builds = built
    m = builds["tail"]["metrics"]
    assert m["host_ops"] == len(TAIL) and m["npu_partitions"] == 1  # the transform on the NPU
    assert m["host_macs"] == 8 * 64 and builds["int8"]["metrics"]["host_macs"] == 0  # the filterbank: [1, 64] x [64, 8]
    assert m["cortex_m_deployable"] and m["device_max_error_lsb"] <= 1 and m["deployed_max_error_lsb"] <= 1
    assert m["precision"]["float_layers"] == sorted(TAIL)
    placed = {p["node"]: p for p in m["offloads"]}
    assert {n: (placed[n]["kind"], placed[n]["rule"]) for n in TAIL} == {n: ("cpu", "kept-float") for n in TAIL}
    assert placed["transform"]["kind"] == "npu"


def test_the_plan_reads_float_between_float_layers_and_float_constants():
    """The rewrite itself: the float layers marked for the host, each reading the previous one's float output
    and its constants as float initializers; the transform's output keeps its Q/DQ pair (the NPU writes it)."""
    qdq = quantize_in_memory(log_power_model(), _inputs(16, 1))
    info = QdqModel(qdq)
    floats = frozenset(a.name for a in info.activations.values() if a.producer is not None
                       and a.producer.name in TAIL)
    mixed = apply_plan(qdq, PrecisionPlan(floats=floats), ("u55",))
    nodes = {n.name: n for n in mixed.graph.node}
    producer = {o: n for n in mixed.graph.node for o in n.output}
    for name in TAIL:
        assert nodes[name].doc_string == HOST_REASON + KEPT_FLOAT
    assert producer[nodes["mel"].input[0]].name == "power"  # float to float: no Q/DQ between
    assert producer[nodes["log"].input[0]].name == "floor"
    inits = {t.name for t in mixed.graph.initializer}
    assert nodes["mel"].input[1] in inits and nodes["floor"].input[1] in inits  # float constants, no DQ
    assert producer[nodes["power"].input[0]].op_type == "DequantizeLinear"  # the NPU's output, dequantised
    assert not nodes["transform"].doc_string
    # precision.json says so: the tail's groups float, the transform's int8
    record = describe(info, PrecisionPlan(floats=floats), {})
    by_layer = {tuple(g["layers"]): g["activations"] for g in record["groups"]}
    assert {by_layer[(name,)] for name in TAIL} == {"float"} and by_layer[("transform",)] == "int8"
    assert record["summary"]["float_layers"] == sorted(TAIL)


def quantize_in_memory(model: onnx.ModelProto, x: np.ndarray) -> onnx.ModelProto:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(model, path)
        return quantize(path, {"x": x}, {"per_channel": True, "method": "minmax", "symmetric_activations": False})


def test_auto_precision_refuses_float_layers(tmp_path: Path, capsys):
    root = tmp_path / "p"
    (root / "configs").mkdir(parents=True)
    (root / "dodo.py").write_text("")
    onnx.save(log_power_model(), root / "configs" / "logpower.onnx")
    np.save(root / "configs" / "calib.npy", _inputs(8, 0))
    (root / "configs" / "a.yaml").write_text(
        SPEC.format(name="a") + "quantization:\n  precision: auto\n  budget: {min_snr_db: 20}\n"
        "  layers:\n    log: {activations: float}\n")
    code, _, err = run_cli(["validate", "configs/a.yaml"], capsys, cwd=root)
    assert code == 2 and "give them with precision: fixed" in err and err.count("\n") == 1


def test_auto_precision_keeps_the_tail_in_float_where_16_bits_cannot(built):
    """`precision: auto` with `host_float`: within the default 2x slowdown no 16-bit plan reaches 40 dB, so the
    search keeps the shortest tail that does in float, the one the hand-written spec names, and the build
    passes with the deployable computing the checked model."""
    _, builds = built
    auto = builds["auto"]
    m = auto["metrics"]
    assert auto["status"] == "passed (mostly host)", auto.get("errors")
    assert m["precision"]["met"] and m["precision"]["float_layers"] == sorted(TAIL)
    tail = m["precision"]["float_tail"]
    assert tail["met"] and tail["layers"] == sorted(TAIL) and tail["within_slowdown"]
    assert m["float_snr_db"] > 40 and m["host_ops"] == len(TAIL)
    assert m["cortex_m_deployable"] and m["device_max_error_lsb"] <= 1


def test_the_tail_stops_at_a_node_the_host_cannot_run():
    """The candidates are the last nodes in graph order back to the first one TensorFlow Lite Micro has no float
    kernel for: without Log, none (the search then leaves the plan as 16 bits made it)."""
    from npubuild.deploy.host_ops import HOST_OPS
    from npubuild.frontend.precision.search import tail_producers

    info = QdqModel(quantize_in_memory(log_power_model(), _inputs(16, 1)))
    assert [n.name for n in tail_producers(info, None)] == ["log", "floor", "mel", "power", "transform"]
    assert [n.name for n in tail_producers(info, frozenset(HOST_OPS))] == ["log", "floor", "mel", "power",
                                                                           "transform"]
    assert tail_producers(info, frozenset(HOST_OPS) - {"Log"}) == []
    assert [n.name for n in tail_producers(info, frozenset(HOST_OPS) - {"Mul"})] == ["log", "floor", "mel"]


def test_without_host_float_the_search_keeps_everything_on_the_npu():
    from npubuild.config.load import default_search_path, load_target
    from npubuild.config.schema import PrecisionBudget
    from npubuild.ethosu.cost import vela_cost
    from npubuild.frontend.precision.ranges import calibration_ranges
    from npubuild.frontend.precision.search import Measure, search

    model, arrays = log_power_model(), {"x": _inputs(16, 1)}
    qdq = quantize_in_memory(model, arrays["x"])
    profile, _ = load_target("ethos-u55-128", default_search_path(Path(__file__).resolve().parents[2]), None)

    def cost(m: onnx.ModelProto):
        return {profile.name: vela_cost(m, [], profile, profile.vela)}

    ranges = calibration_ranges(model, arrays)
    results = {}
    for host_float in (False, True):
        budget = PrecisionBudget(min_snr_db=40, host_float=host_float, weights_int4=False)
        results[host_float] = search(qdq, model, arrays, ("u55",), budget, cost, ranges)
    (plan, record), (tail_plan, tail_record) = results[False], results[True]
    assert not record["met"] and not plan.floats and "float_tail" not in record
    assert tail_record["met"] and tail_record["float_tail"]["layers"] == sorted(TAIL)
    assert Measure(model, arrays)(apply_plan(qdq, tail_plan, ("u55",), ranges)).snr_db >= 40
