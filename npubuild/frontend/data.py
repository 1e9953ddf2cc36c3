"""Input data for calibration and verification: seeded random samples or user arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from npubuild.errors import InputError

ONNX_TO_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8,
              onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT64: np.int64}


def graph_inputs(model: onnx.ModelProto) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    inits = {i.name for i in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        out.append((vi.name, tuple(d.dim_value for d in t.shape.dim), np.dtype(ONNX_TO_NP.get(t.elem_type, np.float32))))
    return out


def load_arrays(path: Path, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """An .npy (single-input models: shape (N, *input_shape)) or .npz (one array per input name)."""
    inputs = graph_inputs(model)
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        else:
            arr = np.load(path, allow_pickle=False)
            if len(inputs) != 1:
                raise InputError(f"an .npy file feeds single-input models only; use .npz with keys "
                                 f"{[i[0] for i in inputs]}", str(path))
            arrays = {inputs[0][0]: arr}
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load array file: {exc}", str(path)) from None
    for name, shape, dtype in inputs:
        if name not in arrays:
            raise InputError(f"no array for input '{name}'", str(path))
        a = arrays[name]
        if tuple(a.shape[1:]) != shape:
            if len(shape) > 0 and shape[0] == 1 and tuple(a.shape[1:]) == shape[1:]:
                a = a[:, None]  # (N, C, H, W) for a batch-1 input: one sample per row
            elif tuple(a.shape) == shape:
                a = a[None]
            else:
                raise InputError(f"array for '{name}' has shape {list(a.shape)}, expected (N, {', '.join(map(str, shape))})",
                                 str(path))
        arrays[name] = a.astype(dtype)
    return arrays


def random_arrays(model: onnx.ModelProto, samples: int, seed: int, low: float, high: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(low, high, size=(samples, *shape)).astype(dtype)
            for name, shape, dtype in graph_inputs(model)}


def calibration_arrays(model: onnx.ModelProto, calibration: dict, npy: Path | None) -> dict[str, np.ndarray]:
    if npy is not None:
        return load_arrays(npy, model)
    r = calibration["random"]
    return random_arrays(model, r["samples"], r["seed"], r["low"], r["high"])


def sample_arrays(model: onnx.ModelProto, calibration: dict, npy: Path | None, samples: int,
                  seed: int) -> dict[str, np.ndarray]:
    """Verification inputs: from the calibration file if there is one, else random in its range."""
    if npy is not None:
        arrays = load_arrays(npy, model)
        rng = np.random.default_rng(seed)
        n = next(iter(arrays.values())).shape[0]
        idx = rng.choice(n, size=min(samples, n), replace=False)
        return {k: v[idx] for k, v in arrays.items()}
    r = calibration["random"]
    return random_arrays(model, samples, seed + 1_000_003, r["low"], r["high"])


def subset(arrays: dict[str, np.ndarray], samples: int, seed: int) -> dict[str, np.ndarray]:
    """A seeded random choice of `samples` rows (the same rows for every input)."""
    n = next(iter(arrays.values())).shape[0]
    idx = np.sort(np.random.default_rng(seed).choice(n, size=min(samples, n), replace=False))
    return {k: v[idx] for k, v in arrays.items()}
