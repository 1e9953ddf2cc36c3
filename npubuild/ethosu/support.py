"""What each Ethos-U family can run, as rules over the TOSA operators a node was lowered to.

Taken from Vela 5.2's TOSA constraints (`vela --supported-ops-report` writes
SUPPORTED_OPS.md) and kept only where Vela really rejects the graph: Vela
decomposes kernels and strides beyond the native limits (a stride-4 or a
65x1 CONV2D compiles on U55), so those are not rules here. Every rule has a
test that builds a graph on both sides of its limit and checks Vela agrees.
Vela has no CPU fallback for TOSA input: a node a rule rejects runs on the
host (onnxruntime), see partition.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from npubuild.config.accelerator import rules_of
from npubuild.tosa.graph import TosaGraphInfo, TosaOpInfo

# Ethos-U55/U65 TOSA summary table (SUPPORTED_OPS.md, "Ethos-U55 and Ethos-U65 TOSA Summary Table").
U55_OPS = frozenset({
    "ABS", "ADD", "ARGMAX", "ARITHMETIC_RIGHT_SHIFT", "AVG_POOL2D", "CAST", "CLAMP", "CLZ", "CONCAT", "CONST",
    "CONST_SHAPE", "CONV2D", "CONV3D", "DEPTHWISE_CONV2D", "IDENTITY", "LOGICAL_LEFT_SHIFT", "MATMUL", "MAXIMUM",
    "MAX_POOL2D", "MINIMUM", "MUL", "NEGATE", "PAD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_SUM", "RESCALE",
    "RESHAPE", "RESIZE", "REVERSE", "SLICE", "SUB", "TABLE", "TILE", "TRANSPOSE", "TRANSPOSE_CONV2D",
})
COMPARISONS = frozenset({"EQUAL", "GREATER", "GREATER_EQUAL"})
FLOAT_TYPES = frozenset({"FP32", "FP16", "BF16"})
ARGMAX_MAX_CHANNELS = 127


@dataclass(frozen=True)
class Rule:
    name: str
    families: frozenset[str]
    check: Callable[[TosaOpInfo, TosaGraphInfo], str | None]  # a reason if the op cannot run, else None


def _dtype(graph: TosaGraphInfo, name: str) -> str:
    t = graph.tensors.get(name)
    return t.dtype if t is not None else "UNKNOWN"


def _op_type(op: TosaOpInfo, graph: TosaGraphInfo) -> str | None:
    if op.op not in U55_OPS:
        return f"TOSA {op.op} is not supported by Vela on Ethos-U55/U65"
    return None


def _pro_int(op: TosaOpInfo, graph: TosaGraphInfo) -> str | None:
    floats = sorted({_dtype(graph, t) for t in op.inputs + op.outputs} & FLOAT_TYPES)
    if floats:
        return f"TOSA {op.op} uses {', '.join(floats)}; Vela compiles the PRO-INT profile only"
    return None


def _comparison_int32(op: TosaOpInfo, graph: TosaGraphInfo) -> str | None:
    if op.op in COMPARISONS:
        bad = sorted({_dtype(graph, t) for t in op.inputs} - {"INT32"})
        if bad:
            return f"TOSA {op.op} on {', '.join(bad)}: Vela compares INT32 only"
    return None


def _argmax_form(op: TosaOpInfo, graph: TosaGraphInfo) -> str | None:
    """Vela 5.2 runs ARGMAX on U55/U65 only over the last axis of an INT8 tensor (axis 1 of [1, 4, 4, 8], axis 0
    of [2, 10] and INT16 input: "Non-passthrough operation (ArgMax) could not run on NPU"); U85 runs all three."""
    if op.op != "ARGMAX" or not op.inputs:
        return None
    t = graph.tensors.get(op.inputs[0])
    if t is None:
        return None
    if t.dtype != "INT8":
        return f"TOSA ARGMAX on {t.dtype}: Ethos-U55/U65 run it on INT8 only"
    if op.attr.get("axis", len(t.shape) - 1) != len(t.shape) - 1:
        return "TOSA ARGMAX over an axis other than the last: Ethos-U55/U65 reduce the last axis only"
    return None


def _argmax_channels(op: TosaOpInfo, graph: TosaGraphInfo) -> str | None:
    if op.op == "ARGMAX" and op.inputs:
        t = graph.tensors.get(op.inputs[0])
        if t is not None and t.shape and t.shape[-1] > ARGMAX_MAX_CHANNELS:
            return f"TOSA ARGMAX over {t.shape[-1]} channels: Ethos-U55/U65 allow 1..{ARGMAX_MAX_CHANNELS}"
    return None


RESIZE_U55_UPSCALES = (2, 4, 8)


def _resize_u55(op: TosaOpInfo, graph: TosaGraphInfo) -> str | None:
    """Vela 5.2 runs TOSA RESIZE on U55/U65 only as nearest pixel replication: per axis scale (2u, 2), offset 1 - u,
    u in 2/4/8 (or a unit axis left alone); bilinear (an INT32/INT48 result) and every other form are rejected."""
    if op.op != "RESIZE" or len(op.inputs) < 3:
        return None
    if _dtype(graph, op.outputs[0]) not in ("INT8", "INT16"):
        return "TOSA RESIZE bilinear: Vela runs it on Ethos-U85 only"
    scale, offset = graph.shapes.get(op.inputs[1]), graph.shapes.get(op.inputs[2])
    src = graph.tensors.get(op.inputs[0])
    if scale is None or offset is None or src is None or len(src.shape) != 4:
        return "TOSA RESIZE with non-constant parameters"
    for axis in range(2):
        n, d, off = scale[2 * axis], scale[2 * axis + 1], offset[axis]
        u = n // 2
        replication = d == 2 and n == 2 * u and off == 1 - u
        if not (replication and (u in RESIZE_U55_UPSCALES or (u == 1 and src.shape[1 + axis] == 1))):
            return "TOSA RESIZE on Ethos-U55/U65 runs only as 2x/4x/8x nearest pixel replication"
    return None


def _transpose_conv_stride_u55(op: TosaOpInfo, graph: TosaGraphInfo) -> str | None:
    """Vela 5.2 on U55/U65: TRANSPOSE_CONV2D strides (1,1), (2,2), (1,2) on a unit-height IFM and kernel, (2,1)
    on a unit-width one; a stride along an axis where IFM and kernel are both 1 moves nothing (Vela agrees)."""
    if op.op != "TRANSPOSE_CONV2D" or len(op.inputs) < 2:
        return None
    src, w = graph.tensors.get(op.inputs[0]), graph.tensors.get(op.inputs[1])
    stride = tuple(op.attr.get("stride", ()))
    if src is None or w is None or len(src.shape) != 4 or len(w.shape) != 4 or len(stride) != 2:
        return None
    unit_h, unit_w = src.shape[1] == 1 and w.shape[1] == 1, src.shape[2] == 1 and w.shape[2] == 1
    eff = (1 if unit_h else stride[0], 1 if unit_w else stride[1])
    if eff in ((1, 1), (2, 2)) or (eff == (1, 2) and unit_h) or (eff == (2, 1) and unit_w):
        return None
    return (f"TOSA TRANSPOSE_CONV2D stride {list(stride)}: Ethos-U55/U65 take (1,1) and (2,2) "
            "((1,2)/(2,1) on a unit-height/width input and kernel)")


RULES = (
    Rule("pro-int-only", frozenset({"u55", "u85"}), _pro_int),
    Rule("u55-resize", frozenset({"u55"}), _resize_u55),
    Rule("u55-op-type", frozenset({"u55"}), _op_type),
    Rule("comparison-int32", frozenset({"u55", "u85"}), _comparison_int32),
    Rule("u55-argmax-axis", frozenset({"u55"}), _argmax_form),
    Rule("u55-argmax-channels", frozenset({"u55"}), _argmax_channels),
    Rule("u55-transpose-conv-stride", frozenset({"u55"}), _transpose_conv_stride_u55),
)


def check_op(op: TosaOpInfo, graph: TosaGraphInfo, fam: str) -> tuple[str, str] | None:
    """(rule name, reason) of the first rule the op breaks on this family, or None if it can run."""
    rules = rules_of(fam)
    for rule in RULES:
        if rules in rule.families:
            reason = rule.check(op, graph)
            if reason:
                return rule.name, reason
    return None


def check_node(ops: list[TosaOpInfo], graph: TosaGraphInfo, fam: str) -> tuple[str, str] | None:
    """A node runs on the NPU only if every TOSA op it became does."""
    for op in ops:
        verdict = check_op(op, graph, fam)
        if verdict:
            return verdict
    return None
