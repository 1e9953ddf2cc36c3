"""Helpers the rewriting passes share (a leading underscore: load_all registers no pass from here)."""

from __future__ import annotations

import onnx_ir as ir


def replace_value(old: ir.Value, new: ir.Value) -> None:
    """Readers of `old` read `new`; a graph output keeps its name (the model's interface is unchanged)."""
    was_output, name = old.is_graph_output(), old.name
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
    if was_output:
        old.name = f"{name}__replaced"
        new.name = name
