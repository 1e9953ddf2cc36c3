"""Load and normalise an ONNX model: checked, QOperator -> QDQ, static shapes, constants and BatchNorm folded.

The import stage's work, also used by tests and tools that start from a model file. External data is read
only from beside the model and folded in (frontend/external_data.py); what would crash or mislead native
code is refused first (frontend/model_checks.py); and the stage runs in a forked child (engine/isolate.py,
as every stage does), so a crash inside onnx's C++ is one error for this model, not the end of the build."""

from __future__ import annotations

import traceback
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError

from npubuild.errors import InputError, InternalError, NpubuildError, is_out_of_memory, one_line
from npubuild.fileio import write_bytes
from npubuild.frontend import input_shapes as shapes_of
from npubuild.frontend.external_data import fold_external_data
from npubuild.frontend.host_runnable import check_onnxruntime_runs, check_runnable, infer_custom_shapes
from npubuild.frontend.input_shapes import InputShape
from npubuild.frontend.model_checks import check_finite, check_model, check_scales, check_value_types
from npubuild.frontend.passes import run_passes, run_passes_modified
from npubuild.frontend.qoperator import to_qdq
from npubuild.frontend.tflite_custom import rewrite_tflite_custom_ops

NORMALISE = ["infinite_bounds", "float32_compute", "unroll_recurrent", "castlike_to_cast", "fold_constants",
             "zero_terms", "exporter_idioms", "conv_scale", "conv_bias", "fold_batchnorm", "fold_pad_into_conv",
             "quantiser_forms", "eliminate_identity", "eliminate_dropout", "remove_unused", "topological_sort"]
CONTROL_FLOW = frozenset({"If", "Loop"})
CONTROL_FLOW_PASSES = ["fold_constants", "fold_control_flow"]
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


def set_static_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]], where: str) -> list[InputShape]:
    """Fix every graph input's dims (frontend/input_shapes.py: the spec's input_shapes, a named dim the same
    size throughout, an open batch dim 1); the exporter's symbolic dims elsewhere are dropped for inference."""
    resolved = shapes_of.resolve(model, shapes, where)
    shapes_of.apply(model, resolved)
    _forget_symbolic_dims(model.graph)
    return resolved


def _forget_symbolic_dims(graph: onnx.GraphProto) -> None:
    """Drop the exporter's symbolic dims ('batch', 'p2o.DynamicDimension.3') from the declared outputs and
    value_info of the graph and its subgraphs: with the inputs fixed, shape inference computes them, but it
    keeps a declared name over a computed size in a subgraph's outputs (Silero VAD's branches stayed
    [batch, 1] where the input made them [1, 1])."""
    for vi in [*graph.output, *graph.value_info]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param") or d.HasField("dim_value") and d.dim_value <= 0:
                    d.Clear()
    for node in graph.node:
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _forget_symbolic_dims(sub)


def normalise(model: onnx.ModelProto, shapes: dict[str, list[int]], where: str) -> onnx.ModelProto:
    model = _step("QOperator -> QDQ rewrite", to_qdq, model, where=where)  # the same QDQ form as onnxruntime's
    model = _step("TFLite custom ops", rewrite_tflite_custom_ops, model, where=where)  # before the checker
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
    check_value_types(model, where)
    model = fold_control_flow(model, where)
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
    check_finite(model, where)
    model = infer_custom_shapes(model)
    if not model.graph.node:  # Vela's raw writer refused it as an internal error ("expects 1 operation")
        outputs = ", ".join(f"'{o.name}'" for o in model.graph.output[:3])
        raise InputError(f"the model computes nothing: its outputs ({outputs}) are its inputs or constants, "
                         "with no node between (nothing to compile for an NPU)", where)
    check_onnxruntime_runs(model, where)
    return model


def fold_control_flow(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """If and Loop nodes that constants and static shapes decide, replaced by the path they take, before any
    other pass looks at the graph (frontend/passes/control_flow.py); then each data-dependent If with cheap
    branches of one shape as both branches and a select (if_select.py). Constants are folded and shapes
    inferred again after each round: a folded Pad width or an inlined branch makes the shapes behind the next
    condition static (Silero VAD's). Each round changes the graph or ends the loop, and nothing a round does is
    undone by the next (folding removes nodes, a host note is written once), so it ends."""
    while any(n.op_type in CONTROL_FLOW for n in model.graph.node):
        ir_model = _step("reading the model into onnx-ir", ir.serde.deserialize_model, model, where=where)
        changed = _step("folding control flow", run_passes_modified, ir_model, CONTROL_FLOW_PASSES, where=where)
        if changed is None:  # nothing static left: the data-dependent Ifs that can become a select
            changed = _step("If to select", run_passes_modified, ir_model, ["if_select"], where=where)
        if changed is None:
            break
        model = ir.serde.serialize_model(changed)
        del model.graph.value_info[:]
        model = _infer(model, where)
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
    return one_line(f"{type(exc).__name__}: {str(exc).strip()}".rstrip(": "))


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
    """One of npubuild's own import steps (a rewrite, a pass, reading into onnx-ir) on a model the checks
    before it accepted: an exception from it is npubuild's fault, never the user's (InternalError, exit 1,
    kind 'internal'), one line naming the node it was working on where that is known."""
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
        raise InternalError(f"{_node_in_traceback(root)}{what} failed: {_first_line(root)}", where,
                            detail=traceback.format_exc()) from None


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
