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


def lowers(*op_types: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        for op in op_types:
            if op in LOWERINGS:
                raise RuntimeError(f"two lowerings registered for {op}")
            LOWERINGS[op] = fn
        return fn

    return register


def supported_op_types() -> list[str]:
    from npubuild.lowering import load_all

    load_all()
    return sorted(LOWERINGS)
