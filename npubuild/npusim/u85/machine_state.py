"""The U85 machine's state between ops (memory regions, chaining buffers, LUT RAM, the accumulator) and the
output step every op ends with (scale, activation, write, trace record)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim.memory import constant_bytes
from npubuild.npusim.npu_op import OpResult, ofm_shape
from npubuild.npusim.u85 import activation, weights
from npubuild.npusim.u85.operands import NONE, TRANSPOSE_NAMES, Chains, Operand, ofm_layout, operand, write

ACC_RESET, ACC_KEEP, ACC_IFM2 = 0, 1, 2  # ACC_FORMAT acc_input: where the accumulator starts


@dataclass(frozen=True)
class AccFormat:
    """ACC_FORMAT: bits 0-1 the accumulator (32/48 bits), 4-5 its source, 6 output disabled, 8-10 microblock."""

    acc48: bool
    source: int
    output: bool
    microblock: int


def acc_format(cmd) -> AccFormat:
    p = cmd.regs.get("ACC_FORMAT", 0)
    return AccFormat(bool(p & 3), (p >> 4) & 3, not (p >> 6) & 1, (p >> 8) & 7)


@dataclass
class Machine:
    """Memory regions, LUT RAM, chaining buffers and the kept accumulator: each with a leading sample axis when
    the memory has one (a batch of samples run in one pass, npusim.u85.machine.run_samples); every op's
    values then are (samples, h, w, c), and constants (weights, scales, LUTs) are read once for all."""

    mem: dict  # region index -> uint8 array ((samples, bytes) for a batch)
    macs: int
    ncores: int
    lut_ram: np.ndarray | None = None
    chains: Chains = field(default_factory=Chains)
    accumulator: np.ndarray | None = None  # kept by an op whose output is disabled

    def __post_init__(self):
        if self.lut_ram is None:
            self.lut_ram = np.zeros((*self.lead, activation.LUT_RAM_BYTES), np.uint8)

    @property
    def lead(self) -> tuple[int, ...]:
        """The memory's leading axes: (samples,) for a batch, () for one sample."""
        return next(iter(self.mem.values())).shape[:-1]

    def take_accumulator(self, shape: tuple[int, ...]) -> np.ndarray:
        acc = self.accumulator
        if acc is None or acc.shape != tuple(shape):
            raise StageError(f"ACC_INPUT_KEEP of a {list(shape)} block, but no earlier op kept one")
        return acc

    def channel_scales(self, cmd, oc: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bias, multiplier, shift) per OFM channel from the scale stream (10-byte entries, ACC_FORMAT's width)."""
        region = self.mem[cmd.regs.get("SCALE_REGION", 0) & 7]
        base = cmd.addr("SCALE_BASE")
        return weights.decode_scales(constant_bytes(region, base, 10 * oc, "scales"), oc, acc_format(cmd).acc48)

    def scales(self, cmd, oc: int) -> tuple[np.ndarray | int, np.ndarray | int, np.ndarray | int]:
        """(bias, multiplier, shift): the scale stream's in per-channel mode (OFM_PRECISION bit 8 clear), else
        no bias and the global OFM_SCALE."""
        if not (cmd.regs.get("OFM_PRECISION", 0) >> 8) & 1:
            return self.channel_scales(cmd, oc)
        mult, shift = activation.global_scale(cmd)
        return 0, mult, shift

    def output(self, cmd, kind: str, acc: np.ndarray, ishape, ifm: Operand, detail: str,
               ifm2_shape=None) -> OpResult:
        """Finish an op: add the kept accumulator (ACC_INPUT_KEEP); then keep the sum (output disabled) or add
        the bias and scale (the output stage: the scale stream's per channel, else OFM_SCALE), activate and
        write the OFM. A kept accumulator has no bias in it: each op of a split sum brings its own scale
        stream, and only the one that outputs applies it."""
        ofm = operand(cmd, "OFM")
        oshape = ofm_shape(cmd)
        accf = acc_format(cmd)
        if accf.source == ACC_KEEP:
            acc = acc + self.take_accumulator(acc.shape)  # the samples' own: the shape includes the batch
        layout = ofm_layout(cmd)
        if not accf.output or ofm.storage == NONE:
            self.accumulator = acc
            out = np.zeros((*acc.shape[:-3], 0), np.int64)
            fmt = "ACC"
        else:
            self.accumulator = None
            bias, mult, shift = self.scales(cmd, acc.shape[-1])
            out = write(self.mem, self.chains, ofm, layout,
                        activation.finish(cmd, acc if _no_bias(bias) else acc + bias, mult, shift, ofm,
                                          self.lut_ram))
            oshape = out.shape[-3:]
            fmt = ofm.label
        if layout.transpose:
            detail = f"{detail} transpose {TRANSPOSE_NAMES[layout.transpose]}".strip()
        if layout.reverse:
            detail = f"{detail} reverse {'HWC'[layout.reverse - 1]}".strip()
        return OpResult(cmd.index, kind, ishape, ifm.label, oshape, fmt, detail, out, ifm2_shape, ofm.fm.bits)


def _no_bias(bias) -> bool:
    """The global scale's bias (the int 0): the accumulator goes to the output stage as it is, not copied."""
    return isinstance(bias, int) and bias == 0
