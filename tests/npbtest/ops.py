"""Per-op test harness, the two kinds the Arm backend uses plus Vela.

- FP: the float ONNX graph lowered to TOSA PRO-FP, run on the TOSA reference
  model, compared with onnxruntime on the float graph.
- INT: the graph quantized by onnxruntime (QDQ), lowered to TOSA PRO-INT,
  compared with onnxruntime on the QDQ graph in LSBs of each output.
- vela: the INT graph compiled by Vela for an accelerator; returns NPU/CPU op counts.

Build single-op models with `single_op_model`; inputs are float32 arrays in ONNX layout.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from npubuild.config.load import default_search_path, load_target
from npubuild.ethosu.vela import parse_operator_counts, vela_command
from npubuild.ethosu.vela_ini import render_ini
from npubuild.frontend.normalise import normalise
from npubuild.frontend.quantize import quantize
from npubuild.lowering.driver import LoweredGraph, lower_model
from npubuild.lowering.options import LoweringOptions
from npubuild.tosa.run import OnnxSession, run_tosa

ROOT = Path(__file__).resolve().parents[2]


def run_onnx(model_path: str, feeds: dict[str, np.ndarray], qdq_semantics: bool = True) -> dict[str, np.ndarray]:
    """One run of a model file on onnxruntime (npubuild.tosa.run.OnnxSession). Default: the QDQ graph as
    written (optimisations off), as npubuild's own checks run it; onnxruntime's optimised session fuses Q/DQ
    chains into int8 kernels whose results depend on the CPU (on an x86 CPU with AVX2 but no VNNI its u8s8
    kernels saturate: 11-21 LSB from the QDQ model measured on conv and reduce tests), so no test may take
    them as its reference unless it says why."""
    return OnnxSession(model_path, qdq_semantics)(feeds)


def single_op_model(op: str, input_shapes: dict[str, list[int]], output_shapes: dict[str, list[int] | None],
                    initializers: dict[str, np.ndarray] | None = None, opset: int = 17,
                    node_inputs: list[str] | None = None, domain: str = "", **attrs) -> onnx.ModelProto:
    """One node `op` reading the graph inputs (then initializers, or `node_inputs` in that order); `domain`
    names a custom operator domain (com.microsoft contrib ops), imported at version 1."""
    initializers = initializers or {}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in input_shapes.items()]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in output_shapes.items()]
    names = node_inputs if node_inputs is not None else [*input_shapes, *initializers]
    node = helper.make_node(op, names, list(output_shapes), name=f"the_{op.lower()}", domain=domain, **attrs)
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    graph = helper.make_graph([node], f"single_{op}", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    if domain:  # onnx's shape inference does not know contrib ops: these are elementwise
        return model
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    known = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    for out in model.graph.output:  # outputs given as None: take the inferred type and shape
        if not out.type.tensor_type.HasField("shape") and known.get(out.name) is not None:
            out.CopyFrom(known[out.name])
    return model


def prepare(model: onnx.ModelProto) -> onnx.ModelProto:
    """The import stage's normalisation (static shapes, folding, shape inference)."""
    return normalise(model, {}, "<test>")


def _save(model: onnx.ModelProto, d: Path, name: str) -> Path:
    p = d / name
    onnx.save(model, p)
    return p


def io_dict(lowered: LoweredGraph) -> dict:
    """The graph's io as io.json holds it (the npu-sim helpers draw integer inputs from it)."""
    return {"profile": lowered.profile, "inputs": [i.to_json() for i in lowered.inputs],
            "outputs": [o.to_json() for o in lowered.outputs]}


def check_fp(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 1e-4,
             atol: float = 1e-4) -> LoweredGraph:
    """Lower the float model to TOSA FP and assert it matches onnxruntime."""
    model = prepare(model)
    lowered = lower_model(model, "fp")
    with tempfile.TemporaryDirectory() as tmp:
        path = _save(model, Path(tmp), "float.onnx")
        ref = run_onnx(str(path), feeds)
    got = run_tosa(lowered.tosa, lowered, feeds)
    for name, r in ref.items():
        np.testing.assert_allclose(got[name], r, rtol=rtol, atol=atol, err_msg=f"output {name}")
    return lowered


def quantize_model(model: onnx.ModelProto, calibration: dict[str, np.ndarray], per_channel: bool = True,
                   symmetric_activations: bool = False) -> onnx.ModelProto:
    """onnxruntime QDQ int8, as the quantize stage does it. Calibration arrays: (N, *input_shape)."""
    model = prepare(model)
    with tempfile.TemporaryDirectory() as tmp:
        path = _save(model, Path(tmp), "float.onnx")
        return quantize(path, calibration, {"per_channel": per_channel, "method": "minmax",
                                            "symmetric_activations": symmetric_activations})


def check_int(model: onnx.ModelProto, calibration: dict[str, np.ndarray], feeds: dict[str, np.ndarray],
              max_lsb: float = 1.0, per_channel: bool = True,
              options: LoweringOptions | None = None, qdq_semantics: bool = True) -> tuple[LoweredGraph, float]:
    """Quantize, lower to TOSA INT, assert every output is within `max_lsb` of onnxruntime's QDQ result.

    The reference runs the QDQ graph as written (DQ -> float op -> Q, onnxruntime's optimisations off, as the
    TOSA check does); `qdq_semantics=False` takes onnxruntime's fused int8 kernels instead, which depend on the
    CPU (run_onnx).
    Returns the lowered graph and the max error in LSB seen.
    """
    qdq = quantize_model(model, calibration, per_channel)
    lowered = lower_model(qdq, "int", options=options)
    with tempfile.TemporaryDirectory() as tmp:
        path = _save(qdq, Path(tmp), "qdq.onnx")
        ref = run_onnx(str(path), feeds, qdq_semantics=qdq_semantics)
    got = run_tosa(lowered.tosa, lowered, feeds)
    worst = 0.0
    for spec in lowered.outputs:
        name = spec.onnx_name
        want = spec.quantize_reference(ref[name]) if spec.scale is not None else ref[name].astype(np.float64)
        err = float(np.max(np.abs(want - got[name].astype(np.float64))))  # LSB, or exact units (indices)
        worst = max(worst, err)
        assert err <= max_lsb, f"output {name}: {err} LSB > {max_lsb}"
    return lowered, worst


def vela_op_counts(tosa: bytes, accelerator: str) -> tuple[int, int]:
    """Compile with Vela (real, default system config is fine for op placement); returns (npu_ops, cpu_ops).

    Raises AssertionError with Vela's output if it fails to compile.
    """
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "m.tosa"
        p.write_bytes(tosa)
        proc = subprocess.run([sys.executable, "-m", "ethosu.vela", str(p), "--accelerator-config", accelerator,
                               "--output-dir", str(Path(tmp) / "out")], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return parse_operator_counts(proc.stdout)


@dataclass
class VelaRun:
    """Vela's summary row and per-layer rows for one compiled graph."""

    summary: dict[str, str]
    layers: list[dict[str, str]]

    @property
    def cycles(self) -> int:
        return int(float(self.summary["cycles_total"]))


def vela_run(tosa: bytes, accelerator: str) -> VelaRun:
    """Compile with Vela (real) and npubuild's own system config for the accelerator, as a build does."""
    profile, _ = load_target(accelerator, default_search_path(ROOT), None)
    with tempfile.TemporaryDirectory() as tmp:
        src, ini, out = Path(tmp) / "m.tosa", Path(tmp) / "system.ini", Path(tmp) / "out"
        src.write_bytes(tosa)
        ini.write_text(render_ini(profile))
        cmd = vela_command(src, ini, out, profile, profile.vela) + ["--verbose-performance"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with next(out.glob("*_summary_*.csv")).open(newline="") as f:
            summary = next(csv.DictReader(f))
        with next(out.glob("*_per-layer.csv")).open(newline="") as f:
            return VelaRun(summary, list(csv.DictReader(f)))


def rand(shape, seed: int = 0, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)


def calib(name: str, shape, n: int = 16, seed: int = 100, low: float = -1.0, high: float = 1.0) -> dict[str, np.ndarray]:
    return {name: rand((n, *shape), seed, low, high)}


def quantize_model16(model: onnx.ModelProto, calibration: dict[str, np.ndarray], weights: str = "int8",
                     activations: str = "int16") -> onnx.ModelProto:
    """onnxruntime's own 16x8 (or 8x4 / 16x4) QDQ quantisation: QInt16 symmetric activations (TOSA's int16
    tensors have zero point 0), per-channel QInt8 or QInt4 weights. An independent reference for the int16
    lowering forms: npubuild's own precision rewrite (frontend/precision) is tested against it separately."""
    from onnxruntime import quantization as ortq

    from npubuild.frontend.quantize import ArrayReader
    from npubuild.frontend.quantized_ops import quantized_op_types

    model = prepare(model)
    types = {"int8": ortq.QuantType.QInt8, "int16": ortq.QuantType.QInt16, "int4": ortq.QuantType.QInt4}
    with tempfile.TemporaryDirectory() as tmp:
        path, out = _save(model, Path(tmp), "float.onnx"), Path(tmp) / "qdq.onnx"
        import logging
        logging.getLogger().setLevel(logging.ERROR)
        ortq.quantize_static(str(path), str(out), ArrayReader(calibration), quant_format=ortq.QuantFormat.QDQ,
                             per_channel=True, activation_type=types[activations], weight_type=types[weights],
                             op_types_to_quantize=quantized_op_types(),
                             extra_options={"ActivationSymmetric": activations == "int16", "WeightSymmetric": True,
                                            "DedicatedQDQPair": False, "ForceQuantizeNoInputCheck": True})
        return onnx.load(str(out))


def check_qdq(qdq: onnx.ModelProto, feeds: dict[str, np.ndarray], max_lsb: float = 1.0, family: str | None = None,
              options: LoweringOptions | None = None) -> tuple[LoweredGraph, float]:
    """Lower a QDQ model to TOSA INT and assert every output is within `max_lsb` of onnxruntime's QDQ result
    (its QDQ semantics: DQ -> float op -> Q, as the TOSA check runs it). Returns the graph and the worst LSB."""
    lowered = lower_model(qdq, "int", family, options=options)
    with tempfile.TemporaryDirectory() as tmp:
        ref = run_onnx(str(_save(qdq, Path(tmp), "qdq.onnx")), feeds, qdq_semantics=True)
    got = run_tosa(lowered.tosa, lowered, feeds)
    worst = 0.0
    for spec in lowered.outputs:
        name = spec.onnx_name
        want = spec.quantize_reference(ref[name]) if spec.scale is not None else ref[name].astype(np.float64)
        err = float(np.max(np.abs(want - got[name].astype(np.float64))))
        worst = max(worst, err)
        assert err <= max_lsb, f"output {name} ({spec.dtype}): {err} LSB > {max_lsb}"
    return lowered, worst
