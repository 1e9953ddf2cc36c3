"""U85: the Concat input Vela must copy, copied by an elementwise MAXIMUM of the input with itself.

Vela writes a Concat input in place only when the Concat is its producer's one
reader; a U-Net skip (read by a MaxPool too) is copied. On U85 Vela runs that
copy, like a standalone RESCALE, CLAMP or 1x1 AVG/MAX_POOL2D, as a pooling pass
(ArchEthosU85::UseAvgPoolNop), costed max(4, kernel) x 4 cycles per output
micro-block: about one cycle per int8 element (skip 64x64x8 on U85-256: 32880
cycles, a 1x1 AVG_POOL2D 33840). An elementwise op is costed 0.25 cycles per
element (EstimateElementwiseCycles). MAXIMUM(x, x) between unit RESCALEs
int8 -> int32 -> int8 is the same integers; Vela fuses the three RESCALEs into
one int8 MAXIMUM written straight into the Concat (8192 cycles), with no
constant at all, where a 1x1 depthwise of ones (U55's copy, 9088 cycles) adds
its weights and per-channel scale/bias to off-chip memory (+0.375 KiB), and an
ADD of a zero scalar a constant (+16 bytes).
"""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

from npubuild.lowering.context import LoweringContext, TTensor, identity
from npubuild.lowering.emit import Op, attr, rescale, reshape


def fits_max_copy(t: TTensor) -> bool:
    """Whether `t` can be copied by the MAXIMUM form: int8 with one scale (the unit RESCALEs are exact then)."""
    return t.q is not None and t.dtype == np.int8 and t.q.is_per_tensor


def max_copy(ctx: LoweringContext, t: TTensor) -> TTensor:
    """A copy of int8 `t` (same quantisation) as RESCALE x2 -> MAXIMUM(a, a) -> RESCALE, all at unit scale."""
    q = t.q
    assert q is not None
    a = rescale(ctx, t, 1.0, np.int32, q.zp, 0, None)
    b = rescale(ctx, t, 1.0, np.int32, q.zp, 0, None)  # one RESCALE per operand: Vela fuses both into the op
    acc = ctx.new_tensor(t.shape, np.int32, t.perm)
    ctx.op(Op.MAXIMUM, [a.name, b.name], [acc.name], attr("Maximum", ts.NanPropagationMode.PROPAGATE))
    return rescale(ctx, acc, 1.0, np.int8, 0, q.zp, q)


def max_copy_rows(ctx: LoweringContext, t: TTensor) -> TTensor:
    """max_copy over an NHWC `t`'s [N, H, 1, W * C] view, one long contiguous row per image row: Vela reads a
    tensor in DRAM that way in long bursts (input_staging.py's narrow image, ops/conv's Concat input)."""
    n, h, w, c = t.shape
    rows = reshape(ctx, t, (n, h, 1, w * c), identity(4))
    return reshape(ctx, max_copy(ctx, rows), (n, h, w, c), t.perm)
