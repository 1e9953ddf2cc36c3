"""The op registry: ONNX op type -> lowering function, filled by the ops_* modules.

A lowering is a plain function `(ctx) -> None` that reads `ctx.current` (the
ONNX node), emits TOSA through the context and binds the node's outputs with
`ctx.set_output`. Register one with `@lowers("Conv", ...)`; an op of another domain as
`@lowers("com.microsoft:Gelu")` (op_key).
"""

from __future__ import annotations

from collections.abc import Callable

from npubuild.lowering.context import LoweringContext

Lowering = Callable[[LoweringContext], None]
LOWERINGS: dict[str, Lowering] = {}
QUANTIZE_ALSO: set[str] = set()  # op types onnxruntime leaves in float unless asked (frontend.quantized_ops)


def op_key(domain: str, op_type: str) -> str:
    """The registry key of a node: its op type in ONNX's own domain, `domain:op_type` in any other (so that
    com.microsoft's contrib Gelu and ONNX's Gelu are two lowerings)."""
    return op_type if domain in ("", "ai.onnx") else f"{domain}:{op_type}"


def lowers(*op_types: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        for op in op_types:
            if op in LOWERINGS:
                raise RuntimeError(f"two lowerings registered for {op}")
            LOWERINGS[op] = fn
        return fn

    return register


def quantize_also(*op_types: str) -> None:
    """Declare op types the quantize stage must ask onnxruntime to quantize too (frontend/quantized_ops.py
    lists them as data; tests/lowering/test_ops_compute.py holds the two equal)."""
    QUANTIZE_ALSO.update(op_types)


def supported_op_types() -> list[str]:
    from npubuild.lowering import load_all

    load_all()
    return sorted(LOWERINGS)
