"""What an NPU operation of every generation shares: its kernel and OFM shape as its registers give them, the
record of what it wrote (OpResult), and a run's result (SimResult)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npubuild.npusim.cmdstream import Command


@dataclass
class Kernel:
    """Kernel size, stride, dilation, weight order and IFM padding of one op, decoded from its registers."""

    h: int
    w: int
    sy: int
    sx: int
    dy: int
    dx: int
    part_kernel: bool
    top: int
    left: int
    bottom: int
    right: int


def kernel_of(cmd: Command) -> Kernel:
    """KERNEL_STRIDE: bit 0/1 stride x/y low bits, 2 part-kernel-first, 3/4 dilation x/y, 6/9 stride x/y high bits.

    KERNEL_WIDTH/HEIGHT_M1 hold the dilated extent minus one.
    """
    p = cmd.regs.get("KERNEL_STRIDE", 0)
    sx = ((p & 1) | ((p >> 6) & 1) << 1) + 1
    sy = (((p >> 1) & 1) | ((p >> 9) & 1) << 1) + 1
    dx, dy = ((p >> 3) & 1) + 1, ((p >> 4) & 1) + 1
    r = cmd.regs
    return Kernel(r.get("KERNEL_HEIGHT_M1", 0) // dy + 1, r.get("KERNEL_WIDTH_M1", 0) // dx + 1, sy, sx, dy, dx,
                  bool(p >> 2 & 1), r.get("IFM_PAD_TOP", 0), r.get("IFM_PAD_LEFT", 0),
                  r.get("IFM_PAD_BOTTOM", 0), r.get("IFM_PAD_RIGHT", 0))


@dataclass
class OpResult:
    """What one op did, for the listing and for op-by-op comparison."""

    index: int
    kind: str
    ifm_shape: tuple[int, int, int]
    ifm_format: str
    ofm_shape: tuple[int, int, int]
    ofm_format: str
    detail: str
    ofm: np.ndarray
    ifm2_shape: tuple[int, int, int] | None = None
    ofm_bits: int = 8


def ofm_shape(cmd: Command) -> tuple[int, int, int]:
    r = cmd.regs
    return r.get("OFM_HEIGHT_M1", 0) + 1, r.get("OFM_WIDTH_M1", 0) + 1, r.get("OFM_DEPTH_M1", 0) + 1


@dataclass
class SimResult:
    """A command stream's run: the graph outputs and, op by op, what each NPU operation wrote."""

    outputs: list[np.ndarray]
    ops: list[OpResult] = field(default_factory=list)
