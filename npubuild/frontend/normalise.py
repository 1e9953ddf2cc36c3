"""Load and normalise an ONNX model: checked, QOperator -> QDQ, static shapes, constants and BatchNorm folded.

The import stage's work, also used by tests and tools that start from a model file. External data is read
only from beside the model and folded in (frontend/external_data.py); what would crash or mislead native
code is refused first (frontend/model_checks.py); and the stage runs in a forked child (engine/isolate.py,
as every stage does), so a crash inside onnx's C++ is one error for this model, not the end of the build."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from npubuild.errors import InputError, NpubuildError, is_out_of_memory
from npubuild.fileio import write_bytes
from npubuild.frontend.external_data import fold_external_data
from npubuild.frontend.host_runnable import check_onnxruntime_runs, check_runnable, infer_custom_shapes
from npubuild.frontend.model_checks import check_model, check_scales
from npubuild.frontend.passes import run_passes
from npubuild.frontend.qoperator import to_qdq

NORMALISE = ["float32_compute", "unroll_recurrent", "castlike_to_cast", "fold_constants", "exporter_idioms",
             "fold_batchnorm", "fold_pad_into_conv", "quantiser_forms", "eliminate_identity", "eliminate_dropout",
             "remove_unused", "topological_sort"]
MIN_OPSET = 13
MAX_FOLD_ROUNDS = 8


def load_onnx(path: Path) -> onnx.ModelProto:
    """Load a model file with one clear error when it is not ONNX; external data folded in from beside it,
    and the checks native code needs (model_checks) passed."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read model: {exc.strerror}", str(path)) from None
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError, RecursionError) as exc:
        raise InputError(f"not an ONNX model ({type(exc).__name__})", str(path)) from None
    if not model.graph.node and not model.graph.output:
        raise InputError("not an ONNX model (empty graph)", str(path))
    fold_external_data(model, path.parent, str(path))
    check_model(model, str(path))
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
    model = _step("QOperator -> QDQ rewrite", to_qdq, model, where=where)  # the same QDQ form as onnxruntime's
    check_scales(model.graph, where)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise InputError(f"ONNX checker: {first}", where) from None
    check_runnable(model, where)  # a custom-domain node runs on the host: onnxruntime must have it
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
        ir_model = _step("reading the model into onnx-ir", ir.serde.deserialize_model, model, where=where)
        ir_model = _step("import passes", run_passes, ir_model, NORMALISE, where=where)
        model = ir.serde.serialize_model(ir_model)
        # clear stale value_info so inference recomputes it from the folded graph
        del model.graph.value_info[:]
        model = _infer(model, where)
        if len(model.graph.node) == before:
            break
    model = infer_custom_shapes(model)
    if not model.graph.node:  # Vela's raw writer refused it as an internal error ("expects 1 operation")
        outputs = ", ".join(f"'{o.name}'" for o in model.graph.output[:3])
        raise InputError(f"the model computes nothing: its outputs ({outputs}) are its inputs or constants, "
                         "with no node between (nothing to compile for an NPU)", where)
    check_onnxruntime_runs(model, where)
    return model


def _infer(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise InputError(f"shape inference failed: {first}", where) from None
    except (RuntimeError, ValueError, TypeError, OverflowError) as exc:  # other errors onnx's C++ raises
        raise InputError(f"shape inference failed: {_first_line(exc)}", where) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _root_cause(exc: BaseException) -> BaseException:
    seen = set()
    while exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return exc


def _node_in_traceback(exc: BaseException) -> str:
    """'node 'x' (Op): ' for the innermost frame working on an ONNX or onnx-ir node, else ''."""
    found = ""
    tb = exc.__traceback__
    while tb is not None:
        node = tb.tb_frame.f_locals.get("node")
        if isinstance(node, (onnx.NodeProto, ir.Node)) and node.op_type:
            found = f"node '{node.name}' ({node.op_type}): "
        tb = tb.tb_next
    return found


def _step(what: str, fn, *args, where: str):
    """One import step on the user's model: an exception from it is a problem of the model (exit 2), one
    line naming the node it was working on where that is known."""
    try:
        return fn(*args)
    except NpubuildError:
        raise
    except RecursionError:
        raise InputError(f"{what}: the model is too deeply nested to import", where) from None
    except Exception as exc:
        if is_out_of_memory(exc):  # the machine's or the stage's memory limit, not the model's fault
            raise MemoryError from None
        root = _root_cause(exc)
        raise InputError(f"{_node_in_traceback(root)}{what} failed: {_first_line(root)}", where) from None


def import_model(src: Path, input_shapes: dict[str, list[int]], out: Path) -> dict:
    """The import stage's work: the model file, checked and normalised, written to `out`; its metrics."""
    model = load_onnx(src)
    before = len(model.graph.node)
    model = normalise(model, input_shapes, str(src))
    write_bytes(out, model.SerializeToString())
    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {"nodes_in": before, "nodes_out": len(model.graph.node), "op_types": ops}
