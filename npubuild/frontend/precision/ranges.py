"""Each float activation's calibration range (min, max over every sample): the range an int16 scale covers."""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.frontend.ptq.stats import exposing, float_tensors


def calibration_ranges(model: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """(min, max) of every float tensor of the float `model` over the calibration `arrays`: one onnxruntime
    session with every tensor exposed, one pass (the int8 range estimators' histograms are not needed here)."""
    import onnxruntime as ort

    names = float_tensors(model)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(exposing(model, names), opts, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    run_names = [k for k in names if k not in inputs]
    n = next(iter(arrays.values())).shape[0]
    lo = dict.fromkeys(names, np.inf)
    hi = dict.fromkeys(names, -np.inf)
    for i in range(n):
        feeds = {k: np.asarray(v[i]) for k, v in arrays.items() if k in inputs}
        values = dict(zip(run_names, session.run(run_names, feeds), strict=True))
        values.update({k: feeds[k] for k in names if k in inputs})
        for k in names:
            v = np.asarray(values[k])
            v = v[np.isfinite(v)] if v.size and not np.isfinite(v).all() else v
            if v.size:
                lo[k], hi[k] = min(lo[k], float(v.min())), max(hi[k], float(v.max()))
    return {k: (lo[k], hi[k]) for k in names if np.isfinite(lo[k]) and np.isfinite(hi[k])}
