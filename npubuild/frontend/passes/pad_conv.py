"""Fold a zero Pad into the Conv that alone reads it (a causal 1-D convolution as torch writes it).

A temporal convolutional network pads each dilated Conv1d on the left only, so that output t sees inputs
up to t: torch exports that as `Pad(x, [0, 0, (k - 1) d, 0, 0, 0])` then a Conv with no padding. The Conv
pads with zeros anyway, so a constant-zero Pad over the spatial axes only is the Conv's own `pads`: the
same function in float, and in int8 too (zero is exact on every int8 grid the quantiser picks, as
minmax calibration always includes it). One PAD pass and its tensor less on the NPU per layer.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from npubuild.frontend.passes import register


def _const(value: ir.Value | None) -> np.ndarray | None:
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def _pad_amounts(pad: ir.Node, rank: int) -> list[int] | None:
    """The Pad's [begin..., end...] over all `rank` axes, or None if they are not constants."""
    if len(pad.inputs) > 1 and pad.inputs[1] is not None:
        pads = _const(pad.inputs[1])
        if pads is None:
            return None
        pads = [int(p) for p in pads.reshape(-1)]
    else:
        attr = pad.attributes.get("pads")
        if attr is None:
            return None
        pads = [int(p) for p in attr.as_ints()]
    axes_in = pad.inputs[3] if len(pad.inputs) > 3 else None
    if axes_in is not None:
        axes = _const(axes_in)
        if axes is None:
            return None
        full = [0] * (2 * rank)
        axes = [int(a) % rank for a in axes.reshape(-1)]
        for k, a in enumerate(axes):
            full[a], full[a + rank] = pads[k], pads[k + len(axes)]
        pads = full
    return pads if len(pads) == 2 * rank else None


def _zero_constant(pad: ir.Node) -> bool:
    if pad.attributes.get_string("mode", "constant") != "constant":
        return False
    value = _const(pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2] is not None else None
    if len(pad.inputs) > 2 and pad.inputs[2] is not None and value is None:
        return False
    if value is None:
        value = np.asarray(pad.attributes.get_float("value", 0.0))
    return bool(np.all(np.asarray(value) == 0))


@register("fold_pad_into_conv")
class FoldPadIntoConv(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for conv in list(model.graph):
            if conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
                continue
            pad = conv.inputs[0].producer() if conv.inputs[0] is not None else None
            if pad is None or pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx"):
                continue
            padded = pad.outputs[0]
            if len(padded.uses()) != 1 or padded.is_graph_output() or not _zero_constant(pad):
                continue
            if conv.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
                continue
            shape = padded.shape
            if shape is None:
                continue
            rank = len(shape)
            amounts = _pad_amounts(pad, rank)
            if amounts is None or rank < 3 or any(amounts[a] or amounts[a + rank] for a in (0, 1)):
                continue
            if any(p < 0 for p in amounts):
                continue
            spatial = rank - 2
            own = list(conv.attributes.get_ints("pads", [0] * 2 * spatial))
            merged = [own[i] + amounts[2 + i] for i in range(spatial)] + \
                     [own[spatial + i] + amounts[rank + 2 + i] for i in range(spatial)]
            conv.attributes["pads"] = ir.AttrInt64s("pads", merged)
            conv.replace_input_with(0, pad.inputs[0])
            model.graph.remove(pad, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified)
