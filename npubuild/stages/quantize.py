"""quantize stage: onnxruntime static int8 quantisation to a QDQ model (frontend/quantize.py); INT pipelines only."""

from __future__ import annotations

from npubuild.build.stage import Chain, Stage, TaskSpec, run_of
from npubuild.config.load import Build
from npubuild.frontend.samples import SampleSource


def plan(b: Build, chain: Chain) -> TaskSpec | None:
    if b.pipeline.profile != "int":  # an FP build lowers the float model itself
        return None
    imp = chain["import"]
    inputs = {"float": imp.outputs["onnx"]}
    if b.calibration_npy is not None:
        inputs["calibration"] = b.calibration_npy
    config = {"import": imp.key, "quantization": b.spec.quantization.model_dump(),
              "calibration": b.model.calibration.model_dump()}
    source = SampleSource.of(b)
    if source.kind == "held-back":  # rows the TOSA check verifies on: not calibrated on (frontend/samples.py)
        config["held_back"] = source.to_json()
    return TaskSpec(b.model_name, config,
                    inputs, {"onnx": "model_qdq.onnx"}, ("import",))


STAGE = Stage("quantize", "npubuild.frontend.quantize", ("onnx", "onnxruntime"), plan, run_of("npubuild.frontend.quantize"),
              preload=("numpy.random",))  # the calibration data
