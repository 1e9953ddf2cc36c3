"""Op-family coverage table (issue 14): per family, how many of its cases lower in FP, in INT, and run on the
Ethos-U55 and U85 NPU.

    PYTHONPATH=<tree> python bench/op_coverage.py [--json out.json]

Each case is a small ONNX graph (the op between layout-keeping neighbours where onnxruntime would not
quantise it alone). FP: lowered and within 1e-4 of onnxruntime; INT: quantised by onnxruntime (QDQ),
lowered and within 1 LSB of the QDQ model's own semantics; U55 / U85: the INT graph accepted by
npubuild's support rules for the family and compiled by Vela with no CPU op. A cell counts passing cases
of the row's total; the status letters per case are p(ass) w(rong) u(nsupported, a clean refusal)
c(rash) h(ost: placed off the NPU by a rule) f(ail: Vela failed on a graph the rules placed on the NPU).
Run it with PYTHONPATH at two revisions to get before/after; measured tables are in bench/op_coverage.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import InputError, NpubuildError
from npubuild.ethosu.vela import parse_operator_counts
from npubuild.frontend.normalise import normalise
from npubuild.frontend.quantize import quantize
from npubuild.lowering.driver import lower_model
from npubuild.tosa.run import OnnxSession, run_tosa

RNG = np.random.default_rng(0)
F = TensorProto.FLOAT


@dataclass
class Case:
    family: str
    build: Callable[[], onnx.ModelProto]
    low: float = -1.0
    high: float = 1.0


def graph(nodes, inputs: dict[str, list[int]], outputs: dict[str, tuple[int, list[int] | None]],
          inits: dict[str, np.ndarray] | None = None, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "case", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                          [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(m)
    known = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    for out in m.graph.output:  # outputs given without a shape take the inferred one
        if not out.type.tensor_type.HasField("shape") and known[out.name].type.tensor_type.HasField("shape"):
            out.CopyFrom(known[out.name])
    return m


def single(op: str, shape, out_shape=None, inits=None, opset: int = 17, extra: list[str] | None = None,
           out_type=F, wrap: bool = True, **attrs) -> Callable[[], onnx.ModelProto]:
    """x -> Sigmoid (so onnxruntime quantises x) -> op -> y."""
    def make() -> onnx.ModelProto:
        first = helper.make_node("Sigmoid", ["x"], ["s"]) if wrap else None
        src = "s" if wrap else "x"
        node = helper.make_node(op, [src, *(extra if extra is not None else list(inits or {}))], ["y"], **attrs)
        return graph([n for n in (first, node) if n is not None], {"x": shape}, {"y": (out_type, out_shape)}, inits,
                     opset)
    return make


def w(*shape, scale: float = 0.4) -> np.ndarray:
    return RNG.normal(0, scale, shape).astype(np.float32)


def recurrent(op: str, **attrs) -> Callable[[], onnx.ModelProto]:
    def make() -> onnx.ModelProto:
        g = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
        inits = {"W": w(1, g * 8, 4), "R": w(1, g * 8, 8), "B": w(1, 2 * g * 8, scale=0.1)}
        node = helper.make_node(op, ["x", "W", "R", "B"], ["", "h"], hidden_size=8, **attrs)
        return graph([node], {"x": [10, 1, 4]}, {"h": (F, [1, 1, 8])}, inits)
    return make


def tcn() -> onnx.ModelProto:
    nodes = [helper.make_node("Pad", ["x", "p"], ["xp"]), helper.make_node("Conv", ["xp", "k"], ["y"], dilations=[2])]
    return graph(nodes, {"x": [1, 4, 16]}, {"y": (F, [1, 4, 16])}, {"p": np.array([0, 0, 4, 0, 0, 0], np.int64),
                                                                   "k": w(4, 4, 3)})


def variadic(op: str) -> Callable[[], onnx.ModelProto]:
    return lambda: graph([helper.make_node(op, ["a", "b", "c"], ["y"])], {"a": [1, 4, 4, 4], "b": [1, 4, 4, 4],
                                                                         "c": [1, 4, 1, 1]}, {"y": (F, [1, 4, 4, 4])})


def matmul_broadcast() -> onnx.ModelProto:
    return graph([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [2, 1, 3, 4], "b": [1, 5, 4, 6]},
                 {"y": (F, [2, 5, 3, 6])})


def topk(k: int) -> Callable[[], onnx.ModelProto]:
    def make() -> onnx.ModelProto:
        nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("TopK", ["s", "k"], ["v", "i"])]
        return graph(nodes, {"x": [2, 10]}, {"v": (F, [2, k]), "i": (TensorProto.INT64, [2, k])},
                     {"k": np.array([k], np.int64)})
    return make


CASES = [
    Case("Conv1d / 1-D pools", single("Conv", [1, 4, 20], None, {"k": w(6, 4, 3)}, pads=[1, 1])),
    Case("Conv1d / 1-D pools", single("Conv", [1, 4, 20], None, {"k": w(4, 1, 3)}, group=4, dilations=[2], pads=[2, 2])),
    Case("Conv1d / 1-D pools", single("MaxPool", [1, 3, 32], kernel_shape=[2])),
    Case("Conv1d / 1-D pools", single("AveragePool", [1, 3, 32], kernel_shape=[3], strides=[2], pads=[1, 1])),
    Case("Conv1d / 1-D pools", single("GlobalAveragePool", [1, 3, 16])),
    Case("dilated causal TCN (Pad + Conv1d)", tcn),
    Case("dilated pools", single("MaxPool", [1, 2, 8, 8], kernel_shape=[2, 2], dilations=[2, 2])),
    Case("dilated pools", single("AveragePool", [1, 2, 8, 8], opset=19, kernel_shape=[2, 2], dilations=[2, 2])),
    Case("3-D pools (refused cleanly)", single("MaxPool", [1, 2, 4, 4, 4], kernel_shape=[2, 2, 2])),
    Case("pool ceil_mode (last window in the padding)", single("AveragePool", [1, 3, 2, 2], kernel_shape=[3, 3],
                                                               strides=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1,
                                                               count_include_pad=1)),
    Case("pool ceil_mode (last window in the padding)", single("MaxPool", [1, 1, 2, 2], kernel_shape=[1, 1],
                                                               strides=[2, 2], ceil_mode=1)),
    Case("ConvTranspose 1-D / dilated", single("ConvTranspose", [1, 4, 6], None, {"k": w(4, 3, 3)}, strides=[2])),
    Case("ConvTranspose 1-D / dilated", single("ConvTranspose", [1, 2, 4, 4], None, {"k": w(2, 3, 3, 3)},
                                               dilations=[2, 2])),
    Case("ConvTranspose stride 3x2", single("ConvTranspose", [1, 2, 4, 4], None, {"k": w(2, 3, 3, 3)}, strides=[3, 2])),
    *[Case("Elu Selu Celu Softplus Softsign Mish Swish", single(op, [1, 4, 8, 8], opset=opset), -4, 4)
      for op, opset in (("Elu", 17), ("Selu", 17), ("Celu", 17), ("Softplus", 17), ("Softsign", 17), ("Mish", 18),
                        ("Swish", 24))],
    *[Case("ThresholdedRelu Shrink Sign Floor Ceil Round", single(op, [1, 4, 8, 8], wrap=False), -3, 3)
      for op in ("ThresholdedRelu", "Shrink", "Sign", "Floor", "Ceil", "Round")],
    Case("ArgMax / ArgMin", single("ArgMax", [2, 10], [2, 1], out_type=TensorProto.INT64, axis=1)),
    Case("ArgMax / ArgMin", single("ArgMin", [1, 4, 6, 6], [1, 1, 6, 6], out_type=TensorProto.INT64, axis=1)),
    Case("Hardmax", single("Hardmax", [2, 10], axis=1)),
    Case("TopK (static K)", topk(1)),
    Case("LpNormalization", single("LpNormalization", [2, 10], axis=1, p=2)),
    Case("LpNormalization", single("LpNormalization", [2, 10], axis=1, p=1)),
    *[Case("ReduceL1/L2/Prod/SumSquare/LogSum/LogSumExp", single(op, [2, 2], [2, 1], {"ax": np.array([1], np.int64)},
                                                                 opset=18, keepdims=1))
      for op in ("ReduceL1", "ReduceL2", "ReduceProd", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")],
    Case("GroupNormalization", single("GroupNormalization", [1, 8, 4, 4], [1, 8, 4, 4], {"g": w(8) + 1, "b": w(8)}, opset=21,
                                      num_groups=2)),
    Case("RMSNormalization", single("RMSNormalization", [2, 6, 16], [2, 6, 16], {"g": w(16) + 1}, opset=23)),
    Case("LRN", single("LRN", [1, 6, 4, 4], size=3)),
    Case("LayerNorm over several axes", single("LayerNormalization", [2, 3, 4, 5], None, {"g": w(4, 5) + 1},
                                               axis=-2)),
    Case("Mean / Sum (variadic)", variadic("Mean")),
    Case("Mean / Sum (variadic)", variadic("Sum")),
    Case("GatherElements (constant indices)", single("GatherElements", [3, 4], [2, 4],
                                                     {"i": np.array([[0, 2, 1, 0], [2, 1, 0, 0]], np.int64)}, axis=0)),
    Case("CastLike", single("CastLike", [3, 4], [3, 4], {"like": np.zeros(1, np.float32)})),
    Case("LSTM", recurrent("LSTM")), Case("GRU", recurrent("GRU", linear_before_reset=1)), Case("RNN", recurrent("RNN")),
    Case("MatMul partial batch broadcast", matmul_broadcast),
    Case("Gemm with a [1, N] / scalar bias", single("Gemm", [3, 8], [3, 5], {"k": w(8, 5), "c": w(1, 5)})),
    Case("Gemm with a [1, N] / scalar bias", single("Gemm", [3, 8], [3, 5], {"k": w(8, 5), "c": np.float32(0.3)})),
    Case("Pow with an int64 exponent", single("Pow", [2, 3], [2, 3], {"e": np.array(2, np.int64)})),
    Case("Resize cubic", single("Resize", [1, 2, 4, 4], None, {"roi": np.zeros(0, np.float32),
                                                                "sc": np.array([1, 1, 2, 2], np.float32)}, mode="cubic")),
    Case("Resize axes=[3,2]", single("Resize", [1, 1, 2, 2], [1, 1, 4, 6], {"roi": np.zeros(0, np.float32),
                                                                            "sc": np.array([3, 2], np.float32)},
                                     opset=19, axes=[3, 2])),
]


def _status(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except (InputError, NpubuildError):  # a one-line error: a clean refusal
        return "u"
    except Exception:  # a Python exception out of npubuild: a crash
        return "c"


def _feeds(model: onnx.ModelProto, case: Case, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.uniform(case.low, case.high, [d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input}


def _vela(tosa: bytes, accel: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "m.tosa"
        p.write_bytes(tosa)
        proc = subprocess.run([sys.executable, "-m", "ethosu.vela", str(p), "--accelerator-config", accel,
                               "--output-dir", str(Path(tmp) / "out")], capture_output=True, text=True, timeout=600)
        return proc.returncode == 0 and parse_operator_counts(proc.stdout)[1] == 0


def _placed(lowered, model: onnx.ModelProto, fam: str) -> bool:
    from npubuild.ethosu.partition import plan_partitions

    plan = plan_partitions(model, lowered, fam)
    return len(plan.partitions) == 1 and plan.partitions[0].kind == "npu"


def run_case(case: Case) -> dict[str, str]:
    out = {"fp": "-", "int": "-", "u55": "-", "u85": "-"}
    try:
        model = normalise(case.build(), {}, "<bench>")
    except NpubuildError:
        return {k: "u" for k in out}

    def fp() -> str:
        lowered = lower_model(model, "fp")
        feeds = _feeds(model, case, 1)
        ref = OnnxSession(model.SerializeToString(), qdq_semantics=False)(feeds)
        got = run_tosa(lowered.tosa, lowered, feeds)
        ok = all(got[k].shape == np.shape(v) and np.allclose(got[k], v, rtol=1e-4, atol=1e-4) for k, v in ref.items())
        return "p" if ok else "w"

    out["fp"] = _status(fp)
    state: dict = {}

    def int8() -> str:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "f.onnx"
            onnx.save(model, path)
            cal = {i.name: np.stack([_feeds(model, case, 100 + k)[i.name] for k in range(16)]) for i in model.graph.input}
            qdq = quantize(path, cal, {"per_channel": True, "method": "minmax", "symmetric_activations": False})
        lowered = lower_model(qdq, "int")
        state.update(lowered=lowered, qdq=qdq)
        feeds = _feeds(model, case, 2)
        ref = OnnxSession(qdq.SerializeToString())(feeds)
        got = run_tosa(lowered.tosa, lowered, feeds)
        worst = 0.0
        for spec in lowered.outputs:
            want = spec.quantize_reference(ref[spec.onnx_name]) if spec.scale is not None else ref[spec.onnx_name]
            if np.shape(want) != got[spec.onnx_name].shape:
                return "w"
            worst = max(worst, float(np.max(np.abs(np.asarray(want, np.float64) - got[spec.onnx_name]))))
        return "p" if worst <= 1.0 else "w"

    out["int"] = _status(int8)
    if "lowered" in state:
        for fam, accel in (("u55", "ethos-u55-128"), ("u85", "ethos-u85-256")):
            def placed(fam=fam, accel=accel) -> str:
                if not _placed(state["lowered"], state["qdq"], fam):
                    return "h"
                return "p" if _vela(state["lowered"].tosa, accel) else "f"
            out[fam] = _status(placed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows: dict[str, list[dict[str, str]]] = {}
    for case in CASES:
        rows.setdefault(case.family, []).append(run_case(case))
    print("| op family | FP | INT | U55 | U85 |\n|---|---|---|---|---|")
    for family, results in rows.items():
        cells = []
        for col in ("fp", "int", "u55", "u85"):
            letters = "".join(r[col] for r in results)
            cells.append(f"{letters.count('p')}/{len(results)} {letters}")
        print(f"| {family} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
