"""Load and normalise an ONNX model: checked, QOperator -> QDQ, static shapes, constants and BatchNorm folded.

The import stage's work, also used by tests and tools that start from a model file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from npubuild.errors import InputError
from npubuild.fileio import write_bytes
from npubuild.frontend.passes import run_passes
from npubuild.frontend.qoperator import to_qdq

if TYPE_CHECKING:
    from npubuild.build.plan import StageTask

NORMALISE = ["unroll_recurrent", "fold_constants", "fold_batchnorm", "fold_pad_into_conv", "quantiser_forms",
             "eliminate_identity", "eliminate_dropout", "remove_unused", "topological_sort"]
MIN_OPSET = 13
MAX_FOLD_ROUNDS = 8


def load_onnx(path: Path) -> onnx.ModelProto:
    """Load a model file with one clear error when it is not ONNX."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read model: {exc.strerror}", str(path)) from None
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InputError(f"not an ONNX model ({type(exc).__name__})", str(path)) from None
    if not model.graph.node and not model.graph.output:
        raise InputError("not an ONNX model (empty graph)", str(path))
    return model


def set_static_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]], where: str) -> None:
    """Fix every graph input's dims: from the spec, else a dynamic batch dim becomes 1."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    names = {i.name for i in inputs}
    for name in shapes:
        if name not in names:
            raise InputError(f"input_shapes names '{name}', but the model's inputs are {sorted(names)}", where)
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        given = shapes.get(vi.name)
        if given is not None:
            if len(given) != len(dims):
                raise InputError(f"input '{vi.name}' has rank {len(dims)}, input_shapes gives {len(given)} dims", where)
            for d, v in zip(dims, given, strict=True):
                if d.HasField("dim_value") and d.dim_value != v:
                    raise InputError(f"input '{vi.name}': dim {d.dim_value} is fixed in the model, spec says {v}", where)
                d.Clear()
                d.dim_value = v
            continue
        for axis, d in enumerate(dims):
            if not d.HasField("dim_value") or d.dim_value <= 0:
                if axis == 0:
                    d.Clear()
                    d.dim_value = 1
                else:
                    label = d.dim_param or "?"
                    raise InputError(f"input '{vi.name}' has dynamic dim '{label}' at axis {axis}: "
                                     f"set input_shapes for it in the spec", where)


def normalise(model: onnx.ModelProto, shapes: dict[str, list[int]], where: str) -> onnx.ModelProto:
    model = to_qdq(model)  # QOperator models from other tools: the same QDQ form as onnxruntime's
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise InputError(f"ONNX checker: {first}", where) from None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None and opset < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as exc:
            raise InputError(f"opset {opset} could not be converted to {MIN_OPSET}: {exc}", where) from None
    set_static_shapes(model, shapes, where)
    model = _infer(model, where)
    for _ in range(MAX_FOLD_ROUNDS):  # folding makes more shapes static, which lets more Shape chains fold
        before = len(model.graph.node)
        ir_model = ir.serde.deserialize_model(model)
        ir_model = run_passes(ir_model, NORMALISE)
        model = ir.serde.serialize_model(ir_model)
        # clear stale value_info so inference recomputes it from the folded graph
        del model.graph.value_info[:]
        model = _infer(model, where)
        if len(model.graph.node) == before:
            break
    return model


def _infer(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise InputError(f"shape inference failed: {first}", where) from None


def run(task: StageTask) -> dict:
    """The import stage: the model file, checked and normalised, as model.onnx."""
    src = task.inputs["model"]
    model = load_onnx(src)
    before = len(model.graph.node)
    model = normalise(model, task.config["input_shapes"], str(src))
    write_bytes(task.outputs["onnx"], model.SerializeToString())
    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {"nodes_in": before, "nodes_out": len(model.graph.node), "op_types": ops}
