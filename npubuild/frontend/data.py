"""Input data for calibration and verification: seeded random samples or user arrays.

User arrays are checked before any tool sees them, each problem one line naming the file and the input:
no samples, a complex, string or object dtype (a complex array would lose its imaginary part), NaN or Inf
values, integers outside the input's type, or a shape that is not N samples of the input's shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from npubuild.errors import InputError

ONNX_TO_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8,
              onnx.TensorProto.INT16: np.int16, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT64: np.int64,
              onnx.TensorProto.BOOL: np.bool_}


def graph_inputs(model: onnx.ModelProto) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    inits = {i.name for i in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        out.append((vi.name, tuple(d.dim_value for d in t.shape.dim), np.dtype(ONNX_TO_NP.get(t.elem_type, np.float32))))
    return out


def _shape_text(shape: tuple[int, ...]) -> str:
    return f"[{', '.join(map(str, shape))}]"


def _expected(shape: tuple[int, ...]) -> str:
    """The shapes load_arrays accepts for an input of `shape`, for the error message."""
    forms = [f"[N, {', '.join(map(str, shape))}]" if shape else "[N]"]
    if len(shape) > 0 and shape[0] == 1:
        forms.append(f"[N, {', '.join(map(str, shape[1:]))}]" if len(shape) > 1 else "[N]")
    return f"{' or '.join(forms)} (N samples of the input's shape {_shape_text(shape)})"


def check_values(name: str, a: np.ndarray, dtype: np.dtype, where: str) -> None:
    """The array can feed an input of `dtype`: real numbers, finite, in the type's range, at least one sample."""
    if a.dtype.kind not in "biuf":
        kind = {"c": "complex", "U": "string", "S": "bytes", "O": "object", "V": "structured", "M": "datetime",
                "m": "timedelta"}.get(a.dtype.kind, a.dtype.kind)
        raise InputError(f"array for '{name}' has {kind} dtype {a.dtype}: inputs take real numbers", where)
    if a.ndim == 0 or a.shape[0] == 0:
        raise InputError(f"array for '{name}' has no samples (shape {_shape_text(a.shape)})", where)
    if a.dtype.kind == "f":
        finite = np.isfinite(a)
        if not finite.all():
            sample = int(np.argwhere(~finite)[0][0])
            raise InputError(f"array for '{name}' has NaN or Inf values (sample {sample})", where)
    if dtype == np.bool_ and a.dtype != np.bool_ and not np.isin(a, (0, 1)).all():
        raise InputError(f"array for '{name}' has values other than 0 and 1 (the input's type is bool)", where)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = a.min(), a.max()
        if lo < info.min or hi > info.max or (a.dtype.kind == "f" and not np.array_equal(a, np.round(a))):
            raise InputError(f"array for '{name}' has values in [{lo}, {hi}], not {dtype} integers "
                             f"(the input's type)", where)


def spread_rows(n: int, k: int) -> list[int]:
    """At most `k` of `n` row indices, evenly spread from the first to the last (k = 2: the first and last)."""
    return sorted({int(i) for i in np.linspace(0, n - 1, min(k, n)).round()}) if n > 0 and k > 0 else []


def _picked(a: np.ndarray, shape: tuple[int, ...], rows: int) -> np.ndarray:
    """`rows` samples of `a` (spread_rows), where its first axis counts samples as load_arrays reads it
    ([N, *shape], or [N, *shape[1:]] for a batch-1 input); anything else as it is, for load_arrays to judge."""
    counts = a.ndim > 0 and (tuple(a.shape[1:]) == shape
                             or (len(shape) > 0 and shape[0] == 1 and tuple(a.shape[1:]) == shape[1:]))
    return np.asarray(a[spread_rows(a.shape[0], rows)]) if counts else np.asarray(a)


def load_arrays(path: Path, model: onnx.ModelProto, rows: int | None = None) -> dict[str, np.ndarray]:
    """An .npy (single-input models: shape (N, *input_shape)) or .npz (one array per input name). `rows`: only
    that many samples, spread over the file (spread_rows), an .npy file mapped so that only they are read
    (the lower stage's few real rows of a calibration file the quantize stage has read whole already)."""
    inputs = graph_inputs(model)
    if not inputs:
        raise InputError("the model has no graph inputs to feed", str(path))
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        else:
            arr = np.load(path, allow_pickle=False, mmap_mode="r" if rows is not None else None)
            if len(inputs) != 1:
                raise InputError(f"an .npy file feeds single-input models only; use .npz with keys "
                                 f"{[i[0] for i in inputs]}", str(path))
            arrays = {inputs[0][0]: arr}
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"cannot load array file: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
                         str(path)) from None
    except Exception as exc:  # a damaged zip (.npz) raises zipfile.BadZipFile and others
        raise InputError(f"cannot load array file: {type(exc).__name__}", str(path)) from None
    for name, shape, dtype in inputs:
        if name not in arrays:
            raise InputError(f"no array for input '{name}' (the file has {sorted(arrays)})", str(path))
        a = arrays[name] if rows is None else _picked(arrays[name], shape, rows)
        check_values(name, a, dtype, str(path))
        if tuple(a.shape[1:]) != shape:
            if len(shape) > 0 and shape[0] == 1 and tuple(a.shape[1:]) == shape[1:]:
                a = a[:, None]  # (N, C, H, W) for a batch-1 input: one sample per row
            elif tuple(a.shape) == shape:
                a = a[None]
            else:
                raise InputError(f"array for '{name}' has shape {_shape_text(a.shape)}; expected {_expected(shape)}",
                                 str(path))
        arrays[name] = a.astype(dtype)
    return arrays


def model_inputs(model_path: Path, input_shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """Just the model's graph (no external data), with the spec's input_shapes applied: what `validate` needs
    to check a calibration file against the model without importing it."""
    try:
        model = onnx.load_model(str(model_path), load_external_data=False)
    except Exception:
        raise InputError("not an ONNX model", str(model_path)) from None
    from npubuild.frontend import input_shapes as shapes_of

    shapes_of.apply(model, shapes_of.resolve(model, input_shapes, str(model_path)))
    return model


def _table_rows(inits: dict[str, onnx.TensorProto], producers: dict[str, onnx.NodeProto], name: str) -> int | None:
    """Rows of the constant table `name` holds (an initializer, a Constant, or the DequantizeLinear of either)."""
    for _ in range(2):
        if name in inits:
            return int(inits[name].dims[0]) if inits[name].dims else None
        node = producers.get(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            return int(value.dims[0]) if value is not None and value.dims else None
        if node.op_type != "DequantizeLinear":
            return None
        name = node.input[0]
    return None


def integer_ranges(model: onnx.ModelProto, low: float = -1.0, high: float = 1.0) -> dict[str, tuple[int, int]]:
    """The values random samples of each integer graph input take (inclusive bounds). An input that only
    indexes constant tables along their first axis (an embedding's token ids into Gather) takes the rows
    every table has, [0, rows - 1]: a uniform float cast to int64 would make every sample row 0, the only
    row calibration would see. A bool input takes 0 and 1; any other integer input the integers of the
    calibration range [low, high]."""
    consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in model.graph.node:
        for i, name in enumerate(n.input):
            consumers.setdefault(name, []).append((n, i))
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}

    def rows_indexed(value: str, depth: int = 0) -> list[int | None]:
        """The rows of each table `value` indexes (None for a reader that is no such Gather), through Casts."""
        found: list[int | None] = []
        for node, i in consumers.get(value, []):
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if node.op_type == "Gather" and i == 1 and axis == 0:
                found.append(_table_rows(inits, producers, node.input[0]))
            elif node.op_type == "Cast" and depth < 2:  # int32 ids cast to int64 first, as exporters write
                found += rows_indexed(node.output[0], depth + 1) or [None]
            else:
                found.append(None)
        return found

    out = {}
    for name, _, dtype in graph_inputs(model):
        if dtype == np.bool_:
            out[name] = (0, 1)
            continue
        if not np.issubdtype(dtype, np.integer):
            continue
        rows = rows_indexed(name)
        info = np.iinfo(dtype)
        if rows and all(r for r in rows):
            out[name] = (0, min(rows) - 1)
        else:
            out[name] = (max(int(np.ceil(low)), int(info.min)), min(int(np.floor(high)), int(info.max)))
    return out


def random_arrays(model: onnx.ModelProto, samples: int, seed: int, low: float, high: float) -> dict[str, np.ndarray]:
    """Seeded uniform samples. Drawn one sample at a time into the final dtype: the same numbers as one
    float64 draw of all of them (the generator's stream is the same), at a quarter of the peak memory.
    Integer and bool inputs take integers (integer_ranges)."""
    rng = np.random.default_rng(seed)
    ranges = integer_ranges(model, low, high)
    out = {}
    for name, shape, dtype in graph_inputs(model):
        a = np.empty((samples, *shape), dtype)
        for i in range(samples):
            if name in ranges:
                a[i] = rng.integers(*ranges[name], size=shape, endpoint=True)
            else:
                a[i] = rng.uniform(low, high, size=shape)
        out[name] = a
    return out


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
