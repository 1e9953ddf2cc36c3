"""quantize stage: onnxruntime static int8 quantisation to a QDQ model (frontend/quantize.py); INT pipelines only."""

from __future__ import annotations

from npubuild.config.load import Build
from npubuild.engine.stage import Chain, Stage, TaskSpec, run_of


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    if b.pipeline.profile != "int":  # an FP build lowers the float model itself
        return None
    imp = chain["import"]
    inputs = {"float": imp.outputs["onnx"]}
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    return TaskSpec(b.model_name, {"import": imp.key, "quantization": b.spec.quantization.model_dump(),
                                   "calibration": b.model.calibration.model_dump()},
                    inputs, {"onnx": "model_qdq.onnx"}, ("import",))


STAGE = Stage("quantize", "npubuild.frontend.quantize", ("onnx", "onnxruntime"), plan, run_of("npubuild.frontend.quantize"),
              preload=("numpy.random",))  # the calibration data
