"""The op registry: ONNX op type -> lowering function, filled by the ops_* modules.

A lowering is a plain function `(ctx) -> None` that reads `ctx.current` (the
ONNX node), emits TOSA through the context and binds the node's outputs with
`ctx.set_output`. Register one with `@lowers("Conv", ...)`.
"""

from __future__ import annotations

from collections.abc import Callable

from npubuild.lowering.context import LoweringContext

Lowering = Callable[[LoweringContext], None]
LOWERINGS: dict[str, Lowering] = {}
QUANTIZE_ALSO: set[str] = set()  # op types onnxruntime leaves in float unless asked, lowered in int8 here


def lowers(*op_types: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        for op in op_types:
            if op in LOWERINGS:
                raise RuntimeError(f"two lowerings registered for {op}")
            LOWERINGS[op] = fn
        return fn

    return register


def quantize_also(*op_types: str) -> None:
    """Ask the quantize stage to put Q/DQ around these op types too (onnxruntime skips ops it has no kernel for)."""
    QUANTIZE_ALSO.update(op_types)


def quantized_op_types() -> list[str]:
    """Every op type the quantize stage asks onnxruntime to quantize: its defaults plus QUANTIZE_ALSO."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    from npubuild.lowering import load_all

    load_all()
    return sorted(set(QDQRegistry) | set(QLinearOpsRegistry) | QUANTIZE_ALSO)


def supported_op_types() -> list[str]:
    from npubuild.lowering import load_all

    load_all()
    return sorted(LOWERINGS)
