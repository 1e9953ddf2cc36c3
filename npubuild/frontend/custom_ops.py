"""Nodes of operator domains other than ONNX's (com.microsoft contrib ops, a product's own `com.example:Foo`).

No lowering takes them, so they run on the host, on onnxruntime; calibration and every check run them
there too. The import stage therefore refuses, with one line naming node and op, a node onnxruntime has
no kernel for, and gives the others their output types and shapes from onnxruntime's symbolic shape
inference, which knows its own contrib ops where onnx's inference knows none (without a shape the
quantiser leaves such a node's neighbours unquantized and the partitioner cannot cut around it).
"""

from __future__ import annotations

from functools import lru_cache

import onnx

from npubuild.errors import InputError

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
