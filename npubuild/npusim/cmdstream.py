"""Decode register command words; snapshot the register state at each NPU_OP.

Word layout (Ethos-U55 TRM; the same on U85): bits 0-9 the command code, bits
14-15 the payload size (0 for cmd0, 1 for cmd1 which carries one more 32-bit
word), bits 16-31 a 16-bit parameter. The names come from a `CommandSet` (this
module's U55/U65 one names only the registers the simulator reads; U85's is in
u85/registers.py); anything else is kept under its hex code so nothing is
silently lost.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npubuild.errors import InputError

OPS = {0x000: "STOP", 0x001: "IRQ", 0x002: "CONV", 0x003: "DEPTHWISE", 0x005: "POOL", 0x006: "ELEMENTWISE",
       0x010: "DMA_START", 0x011: "DMA_WAIT", 0x012: "KERNEL_WAIT", 0x013: "PMU_MASK"}

CMD0 = {
    0x100: "IFM_PAD_TOP", 0x101: "IFM_PAD_LEFT", 0x102: "IFM_PAD_RIGHT", 0x103: "IFM_PAD_BOTTOM",
    0x104: "IFM_DEPTH_M1", 0x105: "IFM_PRECISION", 0x107: "IFM_UPSCALE", 0x109: "IFM_ZERO_POINT",
    0x10A: "IFM_WIDTH0_M1", 0x10B: "IFM_HEIGHT0_M1", 0x10C: "IFM_HEIGHT1_M1", 0x10D: "IFM_IB_END",
    0x10F: "IFM_REGION", 0x111: "OFM_WIDTH_M1", 0x112: "OFM_HEIGHT_M1", 0x113: "OFM_DEPTH_M1",
    0x114: "OFM_PRECISION", 0x115: "OFM_BLK_WIDTH_M1", 0x116: "OFM_BLK_HEIGHT_M1", 0x117: "OFM_BLK_DEPTH_M1",
    0x118: "OFM_ZERO_POINT", 0x11A: "OFM_WIDTH0_M1", 0x11B: "OFM_HEIGHT0_M1", 0x11C: "OFM_HEIGHT1_M1",
    0x11F: "OFM_REGION", 0x120: "KERNEL_WIDTH_M1", 0x121: "KERNEL_HEIGHT_M1", 0x122: "KERNEL_STRIDE",
    0x123: "PARALLEL_MODE", 0x124: "ACC_FORMAT", 0x125: "ACTIVATION", 0x126: "ACTIVATION_MIN",
    0x127: "ACTIVATION_MAX", 0x128: "WEIGHT_REGION", 0x129: "SCALE_REGION", 0x12D: "AB_START",
    0x12F: "BLOCKDEP", 0x130: "DMA0_SRC_REGION", 0x131: "DMA0_DST_REGION", 0x132: "DMA0_SIZE0",
    0x133: "DMA0_SIZE1", 0x180: "IFM2_BROADCAST", 0x181: "IFM2_SCALAR", 0x185: "IFM2_PRECISION",
    0x189: "IFM2_ZERO_POINT", 0x18A: "IFM2_WIDTH0_M1", 0x18B: "IFM2_HEIGHT0_M1", 0x18C: "IFM2_HEIGHT1_M1",
    0x18D: "IFM2_IB_START", 0x18F: "IFM2_REGION",
}

CMD1 = {
    0x000: "IFM_BASE0", 0x001: "IFM_BASE1", 0x002: "IFM_BASE2", 0x003: "IFM_BASE3",
    0x004: "IFM_STRIDE_X", 0x005: "IFM_STRIDE_Y", 0x006: "IFM_STRIDE_C",
    0x010: "OFM_BASE0", 0x011: "OFM_BASE1", 0x012: "OFM_BASE2", 0x013: "OFM_BASE3",
    0x014: "OFM_STRIDE_X", 0x015: "OFM_STRIDE_Y", 0x016: "OFM_STRIDE_C",
    0x020: "WEIGHT_BASE", 0x021: "WEIGHT_LENGTH", 0x022: "SCALE_BASE", 0x023: "SCALE_LENGTH",
    0x024: "OFM_SCALE", 0x025: "OPA_SCALE", 0x026: "OPB_SCALE",
    0x030: "DMA0_SRC", 0x031: "DMA0_DST", 0x032: "DMA0_LEN", 0x033: "DMA0_SKIP0", 0x034: "DMA0_SKIP1",
    0x080: "IFM2_BASE0", 0x081: "IFM2_BASE1", 0x082: "IFM2_BASE2", 0x083: "IFM2_BASE3",
    0x084: "IFM2_STRIDE_X", 0x085: "IFM2_STRIDE_Y", 0x086: "IFM2_STRIDE_C",
    0x090: "WEIGHT1_BASE", 0x091: "WEIGHT1_LENGTH", 0x092: "SCALE1_BASE", 0x093: "SCALE1_LENGTH",
}


@dataclass(frozen=True)
class CommandSet:
    """One generation's command codes: operations (cmd0 and cmd1), register names, and the ops to snapshot."""

    ops: dict[int, str]
    cmd0: dict[int, str]
    cmd1: dict[int, str]
    kinds: tuple[str, ...]  # operations that get a Command (others, e.g. waits, only order the stream)
    long_ops: dict[int, str] = field(default_factory=dict)  # cmd1 operations (U85 BRANCH)


U55 = CommandSet(OPS, CMD0, CMD1, ("CONV", "DEPTHWISE", "POOL", "ELEMENTWISE", "DMA_START"))


@dataclass
class Command:
    """One NPU_OP (or DMA_START) with the full register state at the time it was issued."""

    index: int  # ordinal among operations
    offset: int  # byte offset in the command stream
    kind: str  # CONV, DEPTHWISE, POOL, ELEMENTWISE, DMA_START
    param: int  # the op word's parameter (pool/elementwise mode)
    regs: dict[str, int]  # cmd0: 16-bit param; cmd1: 32-bit data
    hi: dict[str, int]  # cmd1 only: the 16-bit parameter of the payload command (shifts, address high bits)
    # what is derived from the registers alone (fmap.operand's feature maps), kept for the next sample's run
    derived: dict = field(default_factory=dict, compare=False, repr=False)

    def s16(self, name: str) -> int:
        """A cmd0 register read as a signed 16-bit value (zero points, activation bounds)."""
        v = self.regs.get(name, 0)
        return v - 0x10000 if v & 0x8000 else v

    def addr(self, name: str) -> int:
        """A 40-bit address: the payload word plus the high byte carried in the parameter."""
        return self.regs.get(name, 0) | (self.hi.get(name, 0) & 0xFF) << 32


def decode(words: np.ndarray, where: str = "command stream", commands: CommandSet = U55) -> list[Command]:
    """All operations in stream order, each with a snapshot of the registers."""
    regs: dict[str, int] = {}
    hi: dict[str, int] = {}
    out: list[Command] = []
    i, n = 0, len(words)
    while i < n:
        w = int(words[i])
        code, payload, param = w & 0x3FF, (w >> 14) & 3, w >> 16
        if payload:
            if i + 1 >= n:
                raise InputError(f"truncated command at word {i}", where)
            data = int(words[i + 1])
            if code in commands.long_ops:
                kind = commands.long_ops[code]
                out.append(Command(len(out), 4 * i, kind, param, {**regs, kind: data}, dict(hi)))
            else:
                name = commands.cmd1.get(code, f"CMD1_{code:#05x}")
                regs[name] = data
                hi[name] = param
            i += 2
            continue
        if code in commands.ops:
            kind = commands.ops[code]
            if kind == "STOP":
                break
            if kind in commands.kinds:
                out.append(Command(len(out), 4 * i, kind, param, dict(regs), dict(hi)))
        else:
            regs[commands.cmd0.get(code, f"CMD0_{code:#05x}")] = param
        i += 1
    return out
