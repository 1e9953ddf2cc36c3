"""What onnxruntime must be able to run: every node, since any node may end up on the host.

A node no lowering takes runs on the host, on onnxruntime, and calibration and every check run the whole
model there too. The import stage therefore refuses, with one line naming node and op, a model
onnxruntime cannot run (a custom-domain op it has no kernel for, a standard op in a form its kernel
rejects), and gives custom-domain nodes (com.microsoft contrib ops...) their output types and shapes from
onnxruntime's symbolic shape inference, which knows its own contrib ops where onnx's inference knows none
(without a shape the quantiser leaves such a node's neighbours unquantized and the partitioner cannot cut
around it).
"""

from __future__ import annotations

import re
from functools import lru_cache

import onnx

from npubuild.errors import InputError, is_out_of_memory, one_line

STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})


@lru_cache(maxsize=1)
def ort_kernels() -> frozenset[tuple[str, str]] | None:
    """(domain, op type) of every kernel onnxruntime's CPU provider has; None if it cannot say."""
    try:
        from onnxruntime.capi import _pybind_state as ort_c

        defs = ort_c.get_all_opkernel_def()
    except (ImportError, AttributeError):
        return None
    return frozenset((k.domain, k.op_name) for k in defs if k.provider == "CPUExecutionProvider")


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes outside ONNX's domains that are not calls of a function the model itself defines."""
    local = {(f.domain, f.name) for f in model.functions}
    return [n for n in model.graph.node if n.domain not in STANDARD_DOMAINS and (n.domain, n.op_type) not in local]


def check_runnable(model: onnx.ModelProto, where: str) -> None:
    """Every custom-domain node must be one onnxruntime can run: it has no lowering, the host runs it."""
    kernels = ort_kernels()
    if kernels is None:
        return
    for n in custom_nodes(model):
        if (n.domain, n.op_type) not in kernels:
            raise InputError(f"node '{n.name}' ({n.domain}:{n.op_type}): no lowering to TOSA and onnxruntime has "
                             f"no kernel for it, so it can run neither on the NPU nor on the host", where)


def check_onnxruntime_runs(model: onnx.ModelProto, where: str) -> None:
    """onnxruntime must load the model (its kernels check their attributes then); else one line naming the
    first node it cannot run on its own, and why."""
    try:
        _session(model)
    except Exception as exc:  # noqa: BLE001 - onnxruntime's error types differ by cause: any refusal counts
        if is_out_of_memory(exc):  # its thread pool under the stage's memory limit: not the model's fault
            raise MemoryError from None
        found = _failing_node(model)
        what = "the model" if found is None else f"node '{found[1].name}' ({found[1].op_type})" if found[1].name \
            else f"node #{found[0]} ({found[1].op_type})"
        raise InputError(f"{what}: onnxruntime cannot run it: {onnxruntime_reason(exc)}", where) from None


def _session(model: onnx.ModelProto):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def onnxruntime_reason(exc: Exception) -> str:
    """The useful end of an onnxruntime error (after its source location, which says nothing to a user), on
    one line; a long one loses its middle, never the reason at its end."""
    text = " ".join(str(exc).split())
    for marker in (" was false. ", "Exception during initialization: "):
        if marker in text:
            text = text.split(marker, 1)[1]
    text = re.sub(r"/\S*onnxruntime_src/\S+:\d+ [^(]*\([^)]*\) ", "", text)  # graph.cc:1621 void ...Proto()
    return one_line(text, 320)


def _failing_node(model: onnx.ModelProto) -> tuple[int, onnx.NodeProto] | None:
    """The first node (position, node) onnxruntime refuses as a one-node model (run only when the whole model
    fails)."""
    known = {vi.name: vi for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]}
    inits = {t.name: t for t in model.graph.initializer}
    for pos, n in enumerate(model.graph.node):
        ins = [i for i in n.input if i]
        if any(i not in known and i not in inits for i in ins) or any(o and o not in known for o in n.output):
            continue
        g = onnx.helper.make_graph([n], "one", [known[i] for i in ins if i not in inits],
                                   [known[o] for o in n.output if o], [inits[i] for i in ins if i in inits])
        one = onnx.helper.make_model(g, opset_imports=list(model.opset_import))
        one.ir_version = model.ir_version
        try:
            _session(one)
        except Exception:  # noqa: BLE001 - any refusal names this node
            return pos, n
    return None


def infer_custom_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with value_info for the outputs of custom-domain nodes (onnxruntime's symbolic inference)."""
    nodes = custom_nodes(model)
    known = {vi.name for vi in [*model.graph.value_info, *model.graph.output]}
    if all(o in known for n in nodes for o in n.output if o):
        return model
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    try:
        return SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # noqa: BLE001 - an op it does not know either: the partitioner names the tensor
        return model
