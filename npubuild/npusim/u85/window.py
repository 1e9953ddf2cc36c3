"""The IFM as a kernel sees it: padded (zero point, or a pad value for MAX/MIN pooling), upscaled, tap by tap."""

from __future__ import annotations

import numpy as np

from npubuild.npusim.npu_op import Kernel
from npubuild.npusim.u85.machine_state import Machine
from npubuild.npusim.u85.operands import Operand, read

UPSCALE_NEAREST, UPSCALE_ZEROS = 1, 2


def padded_ifm(m: Machine, cmd, ifm: Operand, k: Kernel, oh: int, ow: int, depth: int,
               pad_value: int | None) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(padded IFM, the real IFM shape); pad_value None pads with the zero point. Leading axes: samples."""
    eh = (oh - 1) * k.sy + (k.h - 1) * k.dy + 1
    ew = (ow - 1) * k.sx + (k.w - 1) * k.dx + 1
    ih, iw = eh - k.top - k.bottom, ew - k.left - k.right
    up = cmd.regs.get("IFM_UPSCALE", 0) & 3
    if up:
        src = read(m.mem, m.chains, ifm, (ih + 1) // 2, (iw + 1) // 2, depth)
        if up == UPSCALE_NEAREST:
            x = np.repeat(np.repeat(src, 2, axis=-3), 2, axis=-2)[..., :ih, :iw, :]
        else:
            x = np.full((*src.shape[:-3], ih, iw, depth), ifm.fm.zero_point, np.int64)
            x[..., ::2, ::2, :] = src
    else:
        x = read(m.mem, m.chains, ifm, ih, iw, depth)
    if not (k.top or k.left or k.bottom or k.right):
        return x, (ih, iw, depth)
    fill = ifm.fm.zero_point if pad_value is None else pad_value
    padded = np.full((*x.shape[:-3], eh, ew, depth), fill, np.int64)
    padded[..., k.top:k.top + ih, k.left:k.left + iw, :] = x
    return padded, (ih, iw, depth)
