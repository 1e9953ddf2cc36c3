"""quantize stage: onnxruntime static quantisation to a QDQ int8 model."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnxruntime import quantization as ortq

from npubuild.build.plan import StageTask
from npubuild.errors import StageError
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
        sample = {k: v[self.i] for k, v in self.arrays.items()}
        self.i += 1
        return sample

    def rewind(self) -> None:
        self.i = 0


def quantize(float_model: Path, arrays: dict[str, np.ndarray], q: dict) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory(prefix="npubuild-quant-") as tmp:
        out = Path(tmp) / "qdq.onnx"
        logging.getLogger().setLevel(logging.ERROR)
        try:
            ortq.quantize_static(
                str(float_model),
                str(out),
                ArrayReader(arrays),
                quant_format=ortq.QuantFormat.QDQ,
                per_channel=q["per_channel"],
                activation_type=ortq.QuantType.QInt8,
                weight_type=ortq.QuantType.QInt8,
                calibrate_method=METHODS[q["method"]],
                op_types_to_quantize=quantized_op_types(),
                extra_options={
                    "ActivationSymmetric": q["symmetric_activations"],
                    "WeightSymmetric": True,
                    "DedicatedQDQPair": False,
                    # quantize data-movement ops (MaxPool, Transpose...) even where their input is float:
                    # everything the NPU runs is int8.
                    "ForceQuantizeNoInputCheck": True,
                    **entropy_options(float_model, arrays, q),
                },
            )
        except Exception as exc:
            raise StageError(f"onnxruntime quantisation failed: {type(exc).__name__}: {exc}") from None
        qdq = onnx.load(str(out))
    fold_linear_bias(qdq, onnx.load(str(float_model)))  # MatMul + bias Add as one layer, as TFLite's FullyConnected
    return qdq


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
