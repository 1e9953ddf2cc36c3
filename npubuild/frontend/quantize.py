"""quantize stage: onnxruntime static quantisation to a QDQ int8 model."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime import quantization as ortq

from npubuild.build.plan import StageTask
from npubuild.errors import InputError, StageError
from npubuild.fileio import write_bytes
from npubuild.frontend.calibration import entropy_options
from npubuild.frontend.data import calibration_arrays
from npubuild.frontend.qdq_concat import share_concat_scales
from npubuild.frontend.qdq_linear import fold_linear_bias
from npubuild.frontend.qoperator import is_quantized
from npubuild.frontend.quantized_ops import quantized_op_types

METHODS = {
    "minmax": ortq.CalibrationMethod.MinMax,
    "entropy": ortq.CalibrationMethod.Entropy,
    "percentile": ortq.CalibrationMethod.Percentile,
}


class ArrayReader(ortq.CalibrationDataReader):
    """Feeds one sample at a time from per-input arrays of shape (N, ...)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        self.n = next(iter(arrays.values())).shape[0]
        self.i = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= self.n:
            return None
        sample = {k: np.asarray(v[self.i]) for k, v in self.arrays.items()}  # a rank-0 input: an array too
        self.i += 1
        return sample

    def rewind(self) -> None:
        self.i = 0


def quantize(float_model: Path, arrays: dict[str, np.ndarray], q: dict) -> onnx.ModelProto:
    """The float model quantised to QDQ int8 by onnxruntime. Where onnxruntime's quantiser fails on one op type
    (a Gemm with a matrix bias, a LayerNormalization over several axes), that op type is left in float and
    everything around it quantised: those nodes then run on the host."""
    source = onnx.load(str(float_model))
    model = vector_gemm_biases(source)
    with tempfile.TemporaryDirectory(prefix="npubuild-quant-") as tmp:
        path = float_model
        if model is not source:
            path = Path(tmp) / "float.onnx"
            onnx.save(model, path)
        out = Path(tmp) / "qdq.onnx"
        logging.getLogger().setLevel(logging.ERROR)
        op_types = quantized_op_types()
        try:
            _quantize_static(path, out, arrays, q, op_types)
        except Exception as exc:
            if not _without_one_op_type(model, path, out, arrays, q, op_types):
                raise StageError(f"onnxruntime quantisation failed: {type(exc).__name__}: {exc}") from None
        qdq = onnx.load(str(out))
    _check_scales(qdq)
    fold_linear_bias(qdq, model)  # MatMul + bias Add as one layer, as TFLite's FullyConnected
    return qdq


def _quantize_static(path: Path, out: Path, arrays: dict[str, np.ndarray], q: dict, op_types: list[str]) -> None:
    ortq.quantize_static(
        str(path),
        str(out),
        ArrayReader(arrays),
        quant_format=ortq.QuantFormat.QDQ,
        per_channel=q["per_channel"],
        activation_type=ortq.QuantType.QInt8,
        weight_type=ortq.QuantType.QInt8,
        calibrate_method=METHODS[q["method"]],
        op_types_to_quantize=op_types,
        extra_options={
            "ActivationSymmetric": q["symmetric_activations"],
            "WeightSymmetric": True,
            "DedicatedQDQPair": False,
            # quantize data-movement ops (MaxPool, Transpose...) even where their input is float:
            # everything the NPU runs is int8.
            "ForceQuantizeNoInputCheck": True,
            **entropy_options(path, arrays, q),
        },
    )


def _without_one_op_type(model: onnx.ModelProto, path: Path, out: Path, arrays: dict[str, np.ndarray], q: dict,
                         op_types: list[str]) -> bool:
    """Quantise again with one of the model's op types left in float, in graph order; True once one works."""
    present = list(dict.fromkeys(n.op_type for n in model.graph.node if n.op_type in op_types))
    for skip in present:
        try:
            _quantize_static(path, out, arrays, q, [t for t in op_types if t != skip])
        except Exception:  # noqa: BLE001 - the quantiser fails on another op type too: try the next
            continue
        return True
    return False


def vector_gemm_biases(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each constant Gemm bias of shape [1, N], [1] or [] as a [N] vector (same values by
    broadcasting): onnxruntime's quantiser takes only a 1-D bias. The model itself if there is none."""
    inits = {t.name: t for t in model.graph.initializer}
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    changes: dict[int, np.ndarray] = {}
    for k, n in enumerate(model.graph.node):
        if n.op_type != "Gemm" or len(n.input) < 3 or n.input[2] not in inits or n.input[1] not in inits:
            continue
        b_shape = list(inits[n.input[1]].dims)
        trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
        cols = b_shape[0] if trans_b else b_shape[-1]
        c = numpy_helper.to_array(inits[n.input[2]])
        if c.ndim == 1 and c.shape[0] == cols or c.size not in (1, cols) or (c.ndim == 2 and c.shape[0] != 1):
            continue
        changes[k] = np.ascontiguousarray(np.broadcast_to(c.reshape(-1), (cols,)))
    if not changes:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for k, vector in changes.items():
        node = out.graph.node[k]
        name = f"{node.input[2]}_vector"
        out.graph.initializer.append(numpy_helper.from_array(vector, name))
        node.input[2] = name
    return out


def _check_scales(qdq: onnx.ModelProto) -> None:
    """Every scale onnxruntime calibrated must be finite: a tensor with inf or NaN values has no int8 grid."""
    inits = {t.name: t for t in qdq.graph.initializer}
    for n in qdq.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[1] in inits:
            scale = numpy_helper.to_array(inits[n.input[1]])
            if not np.all(np.isfinite(scale)):
                raise InputError(f"tensor '{n.input[0]}' calibrates to a non-finite range (inf or NaN in its "
                                 f"values): int8 cannot represent it")


def run(task: StageTask) -> dict:
    float_model = task.inputs["float"]
    model = onnx.load(str(float_model))
    if is_quantized(model):  # quantised by another tool (QDQ, or QOperator normalised at import): keep it
        write_bytes(task.outputs["onnx"], model.SerializeToString())
        return {"prequantized": True, "calibration_samples": 0,
                **{op: sum(n.op_type == op for n in model.graph.node) for op in ("QuantizeLinear", "DequantizeLinear")}}
    arrays = calibration_arrays(model, task.config["calibration"], task.inputs.get("calibration"))
    qdq = quantize(float_model, arrays, task.config["quantization"])
    share_concat_scales(qdq, task.config["quantization"]["symmetric_activations"])  # TFLite-style concat scales
    write_bytes(task.outputs["onnx"], qdq.SerializeToString())
    counts = {"QuantizeLinear": 0, "DequantizeLinear": 0}
    for n in qdq.graph.node:
        if n.op_type in counts:
            counts[n.op_type] += 1
    return {"calibration_samples": int(next(iter(arrays.values())).shape[0]), **counts}
