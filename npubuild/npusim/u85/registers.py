"""The Ethos-U85 register map: command codes, field layouts and enum names (as Arm's public driver headers list them).

A command is one 32-bit word (cmd0: bits 0-9 code, bits 14-15 = 0, bits 16-31 parameter) or two (cmd1:
bits 14-15 = 1, the second word a 32-bit payload). A field is given by its bit position in the 64-bit
value word0 | word1 << 32. Codes with bit 8 clear (cmd0) or set (cmd1) are operations; the rest set a
register. `disassemble` renders each command as Vela's `--verbose-register-command-stream` does, which
the tests use as an oracle for these tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npubuild.errors import InputError
from npubuild.npusim.cmdstream import CommandSet

ENUMS: dict[str, dict[int, str]] = {
    "ACC_FORMAT": {0: "I32", 1: "I48"},
    "ACC_INPUT": {0: "RESET", 1: "KEEP", 2: "IFM2"},
    "ACC_OUTPUT": {0: "ENABLE", 1: "DISABLE"},
    "ACTIVATION_CLIP_RANGE": {0: "B16", 1: "NONE"},
    "ACTIVATION_FORMAT": {0: "NHWC", 1: "NHCWB16"},
    "ACTIVATION_FUNCTION": {0: "LUT_NONE", 1: "LUT_U8_U8", 4: "LUT_S8_S8", 5: "LUT_S8_S16", 7: "LUT_S8_S32",
                            8: "LUT_S16_S16", 9: "LUT_S16_S32", 10: "LUT_TANH", 11: "LUT_SIGMOID"},
    "ACTIVATION_PRECISION": {0: "B8", 1: "B16", 2: "B32", 3: "B64"},
    "ACTIVATION_REVERSE": {0: "NONE", 1: "H", 2: "W", 3: "C"},
    "ACTIVATION_STORAGE": {0: "TILE2X2", 1: "TILE3X1", 2: "CHAINED", 3: "NONE"},
    "ACTIVATION_TRANSPOSE": {0: "HWC", 1: "WHC", 2: "HCW", 3: "WCH", 6: "CHW", 7: "CWH"},
    "ACTIVATION_TYPE": {0: "UNSIGNED", 1: "SIGNED"},
    "BRANCH_COND": {0: "ALWAYS", 1: "RF_TRUE"},
    "BROADCAST_MODE": {0: "NONE", 1: "H", 2: "W", 3: "HW", 4: "C", 5: "CH", 6: "CW", 7: "CWH", 8: "SCALAR"},
    "DMA_IDX_MODE": {0: "DISABLED", 1: "ENABLED"},
    "DMA_REGION_MODE": {0: "EXTERNAL", 1: "INTERNAL"},
    "DMA_STRIDE_MODE": {0: "D1", 1: "D2", 2: "D3"},
    "ELEMENTWISE_MODE": {0: "MUL", 1: "ADD", 2: "SUB", 3: "MIN", 4: "MAX", 5: "LRELU", 6: "ABS", 7: "CLZ", 8: "SHR",
                         9: "SHL", 10: "LSR", 11: "DIV", 16: "CMP_EQ", 17: "CMP_NE", 18: "CMP_GE", 19: "CMP_GT",
                         33: "AND", 34: "OR", 35: "XOR", 36: "NOT", 42: "AND_NOT"},
    "IFM_UPSCALE_MODE": {0: "NONE", 1: "NEAREST", 2: "ZEROS"},
    "KERNEL_DECOMPOSITION": {0: "D8X8", 1: "D4X4"},
    "KERNEL_DILATION": {0: "NONE", 1: "X2"},
    "MICROBLOCK": {0: "U1X1", 1: "U1X2", 2: "U1X4", 3: "U2X2", 4: "U2X4", 5: "U4X4"},
    "OFM_SCALE_MODE": {0: "PER_CHANNEL", 1: "GLOBAL"},
    "POOLING_MODE": {0: "MAX", 1: "AVERAGE", 2: "REDUCE_SUM", 3: "SUM", 4: "NONE", 5: "MIN", 6: "ARGMAX_X",
                     7: "ARGMAX_Y"},
    "RESIZE_MODE": {0: "BILINEAR", 1: "REPLICATE", 2: "NEAREST"},
    "ROUND_MODE_IFM": {0: "DOUBLE_SYMMETRIC", 1: "NATURAL"},
    "ROUND_MODE_OFM": {0: "DOUBLE_SYMMETRIC", 1: "NATURAL", 2: "DOUBLE_ASYMMETRIC", 3: "SYMMETRIC",
                       4: "TRUNCATE_TO_ZERO", 5: "TRUNCATE_TO_LOWER"},
    "WEIGHT_FORMAT": {0: "SWD", 1: "FWD"},
    "WEIGHT_ORDER": {0: "DEPTH_FIRST", 1: "PART_KERNEL_FIRST"},
    "WEIGHT_SPARSITY": {0: "NONE", 1: "SPARSE_2_4"},
}


@dataclass(frozen=True)
class Field:
    name: str
    bit: int  # in word0 | word1 << 32
    width: int
    enum: str | None = None  # a key of ENUMS; None: an integer
    signed: bool = False  # two's complement in `width` bits (the resize offsets)

    def get(self, value: int) -> int:
        v = (value >> self.bit) & ((1 << self.width) - 1)
        return v - (1 << self.width) if self.signed and v >> (self.width - 1) else v

    def render(self, value: int) -> str:
        v = self.get(value)
        return f"{self.enum}_{ENUMS[self.enum].get(v, '****')}" if self.enum else str(v)


@dataclass(frozen=True)
class Register:
    code: int  # 10-bit command code
    name: str  # without the NPU_SET_/NPU_OP_ prefix
    is_op: bool
    long: bool  # cmd1: two words
    fields: tuple[Field, ...]

    @property
    def full_name(self) -> str:
        return ("NPU_OP_" if self.is_op else "NPU_SET_") + self.name


def _f(spec: str) -> tuple[Field, ...]:
    """'name@bit:width[:ENUM|:signed]' separated by spaces."""
    out = []
    for item in spec.split():
        name, rest = item.split("@")
        parts = rest.split(":")
        kind = parts[2] if len(parts) > 2 else None
        out.append(Field(name, int(parts[0]), int(parts[1]), None if kind == "signed" else kind, kind == "signed"))
    return tuple(out)


_OPS0 = {
    0x000: ("STOP", "mask@16:16"), 0x001: ("IRQ", "mask@16:16"), 0x002: ("CONV", "weights_ifm2@16:1"),
    0x003: ("DEPTHWISE", ""), 0x005: ("POOL", "pooling_mode@16:3:POOLING_MODE"),
    0x006: ("ELEMENTWISE", "elementwise_mode@16:6:ELEMENTWISE_MODE"), 0x007: ("RESIZE", "resize_mode@16:2:RESIZE_MODE"),
    0x010: ("DMA_START", ""), 0x011: ("DMA_WAIT", "k@16:2"), 0x012: ("KERNEL_WAIT", "n@16:1"),
    0x013: ("PMU_MASK", "enable@16:1"),
}
_PREC_IN = ("activation_type@16:1:ACTIVATION_TYPE activation_precision@18:2:ACTIVATION_PRECISION "
            "activation_format@22:2:ACTIVATION_FORMAT activation_storage@30:2:ACTIVATION_STORAGE")
_SET0 = {
    0x100: ("IFM_PAD_TOP", "pad@16:7"), 0x101: ("IFM_PAD_LEFT", "pad@16:7"), 0x102: ("IFM_PAD_RIGHT", "pad@16:8"),
    0x103: ("IFM_PAD_BOTTOM", "pad@16:8"), 0x104: ("IFM_DEPTH_M1", "depth_m1@16:16"), 0x105: ("IFM_PRECISION", _PREC_IN),
    0x107: ("IFM_UPSCALE", "mode@16:2:IFM_UPSCALE_MODE"), 0x108: ("IFM_BROADCAST", "broadcast_mode@16:4:BROADCAST_MODE"),
    0x109: ("IFM_ZERO_POINT", "zero_point@16:16"), 0x10A: ("IFM_WIDTH0_M1", "width_m1@16:16"),
    0x10B: ("IFM_HEIGHT0_M1", "height_m1@16:16"), 0x10C: ("IFM_HEIGHT1_M1", "height_m1@16:16"),
    0x10F: ("IFM_REGION", "region@16:3"), 0x111: ("OFM_WIDTH_M1", "width_m1@16:16"),
    0x112: ("OFM_HEIGHT_M1", "height_m1@16:16"), 0x113: ("OFM_DEPTH_M1", "depth_m1@16:16"),
    0x114: ("OFM_PRECISION", "activation_type@16:1:ACTIVATION_TYPE activation_precision@17:2:ACTIVATION_PRECISION "
                             "activation_format@22:2:ACTIVATION_FORMAT scale_mode@24:1:OFM_SCALE_MODE "
                             "activation_reverse@25:2:ACTIVATION_REVERSE activation_transpose@27:3:ACTIVATION_TRANSPOSE "
                             "activation_storage@30:2:ACTIVATION_STORAGE"),
    0x115: ("OFM_BLK_WIDTH_M1", "width_m1@16:7"), 0x116: ("OFM_BLK_HEIGHT_M1", "height_m1@16:7"),
    0x117: ("OFM_BLK_DEPTH_M1", "depth_m1@16:10"), 0x118: ("OFM_ZERO_POINT", "zero_point@16:16"),
    0x11A: ("OFM_WIDTH0_M1", "width_m1@16:16"), 0x11B: ("OFM_HEIGHT0_M1", "height_m1@16:16"),
    0x11C: ("OFM_HEIGHT1_M1", "height_m1@16:16"), 0x11F: ("OFM_REGION", "region@16:3"),
    0x120: ("KERNEL_WIDTH_M1", "width_m1@16:16"), 0x121: ("KERNEL_HEIGHT_M1", "height_m1@16:16"),
    0x122: ("KERNEL_STRIDE", "stride_x_lsb@16:1 stride_y_lsb@17:1 weight_order@18:1:WEIGHT_ORDER "
                             "dilation_x@19:1:KERNEL_DILATION dilation_y@20:1:KERNEL_DILATION "
                             "decomposition@21:1:KERNEL_DECOMPOSITION stride_x_msb@22:1 stride_y_msb@25:1"),
    0x124: ("ACC_FORMAT", "acc_format@16:2:ACC_FORMAT acc_input@20:2:ACC_INPUT acc_output@22:1:ACC_OUTPUT "
                          "microblock@24:3:MICROBLOCK"),
    0x125: ("ACTIVATION", "activation_function@16:5:ACTIVATION_FUNCTION table@21:3 "
                          "activation_clip_range@28:1:ACTIVATION_CLIP_RANGE"),
    0x126: ("ACTIVATION_MIN", "clip_boundary@16:16"), 0x127: ("ACTIVATION_MAX", "clip_boundary@16:16"),
    0x128: ("WEIGHT_REGION", "region@16:3"), 0x129: ("SCALE_REGION", "region@16:3"),
    0x12A: ("RESIZE_X_SCALE_N_M1", "resize_x_scale_n_m1@16:11"), 0x12B: ("RESIZE_Y_SCALE_N_M1", "resize_y_scale_n_m1@16:11"),
    0x12C: ("RESIZE_X_OFFSET", "resize_x_offset@16:12:signed"), 0x12D: ("RESIZE_Y_OFFSET", "resize_y_offset@16:12:signed"),
    0x12E: ("WEIGHT_FORMAT", "weight_format@16:1:WEIGHT_FORMAT weight_sparsity@20:1:WEIGHT_SPARSITY"),
    0x12F: ("BLOCKDEP", "blockdep@16:3"),
    0x130: ("DMA0_SRC_REGION", "region@16:3 region_mode@24:1:DMA_REGION_MODE stride_mode@25:2:DMA_STRIDE_MODE "
                               "idx_mode@27:1:DMA_IDX_MODE"),
    0x131: ("DMA0_DST_REGION", "region@16:3 region_mode@24:1:DMA_REGION_MODE idx_mode@27:1:DMA_IDX_MODE"),
    0x132: ("DMA0_SIZE0", "size@16:16"), 0x133: ("DMA0_SIZE1", "size@16:16"), 0x134: ("DMA0_IDX_REGION", "region@16:3"),
    0x180: ("IFM2_BROADCAST", "broadcast_mode@16:4:BROADCAST_MODE"), 0x185: ("IFM2_PRECISION", _PREC_IN),
    0x189: ("IFM2_ZERO_POINT", "zero_point@16:16"), 0x18A: ("IFM2_WIDTH0_M1", "width_m1@16:16"),
    0x18B: ("IFM2_HEIGHT0_M1", "height_m1@16:16"), 0x18C: ("IFM2_HEIGHT1_M1", "height_m1@16:16"),
    0x18F: ("IFM2_REGION", "region@16:3"),
}
_SCALE = "shift@16:6 dbl_rnd@22:5 round_mode@29:{} scale@32:31"
_ADDRESSES = {  # cmd1 registers holding a 40-bit address or a byte count/stride in the same layout
    0x000: "IFM_BASE0", 0x001: "IFM_BASE1", 0x002: "IFM_BASE2", 0x003: "IFM_BASE3", 0x004: "IFM_STRIDE_X",
    0x005: "IFM_STRIDE_Y", 0x006: "IFM_STRIDE_C", 0x010: "OFM_BASE0", 0x011: "OFM_BASE1", 0x012: "OFM_BASE2",
    0x013: "OFM_BASE3", 0x014: "OFM_STRIDE_X", 0x015: "OFM_STRIDE_Y", 0x016: "OFM_STRIDE_C", 0x020: "WEIGHT_BASE",
    0x022: "SCALE_BASE", 0x030: "DMA0_SRC", 0x031: "DMA0_DST", 0x032: "DMA0_LEN", 0x033: "DMA0_SRC_STRIDE0",
    0x034: "DMA0_SRC_STRIDE1", 0x035: "DMA0_DST_STRIDE0", 0x036: "DMA0_DST_STRIDE1", 0x037: "DMA0_IDX",
    0x039: "DMA0_IDX_SKIP1", 0x080: "IFM2_BASE0", 0x081: "IFM2_BASE1", 0x082: "IFM2_BASE2", 0x083: "IFM2_BASE3",
    0x084: "IFM2_STRIDE_X", 0x085: "IFM2_STRIDE_Y", 0x086: "IFM2_STRIDE_C", 0x090: "WEIGHT1_BASE",
    0x092: "WEIGHT2_BASE", 0x094: "WEIGHT3_BASE",
}
_SET1 = {
    0x021: ("WEIGHT_LENGTH", "length@32:32"), 0x023: ("SCALE_LENGTH", "length@32:20"),
    0x024: ("OFM_SCALE", _SCALE.format("3:ROUND_MODE_OFM")), 0x025: ("IFM_SCALE", _SCALE.format("1:ROUND_MODE_IFM")),
    0x026: ("IFM2_SCALE", _SCALE.format("1:ROUND_MODE_IFM")), 0x027: ("OP_SCALAR", "scalar@32:32"),
    0x038: ("DMA0_IDX_MAX", "idx_max@32:31"), 0x091: ("WEIGHT1_LENGTH", "length@32:32"),
    0x093: ("WEIGHT2_LENGTH", "length@32:32"), 0x095: ("WEIGHT3_LENGTH", "length@32:32"),
    0x096: ("RESIZE_X_STEP", "one_step_int@16:4 blk_step_int@20:11 one_step_mod@32:11 blk_step_mod@48:11"),
    0x097: ("RESIZE_Y_STEP", "one_step_int@16:4 blk_step_int@20:11 one_step_mod@32:11 blk_step_mod@48:11"),
}
_OPS1 = {0x100: ("BRANCH", "branch_cond@16:1:BRANCH_COND branch_target@32:32")}

ADDRESS = Field("addr", 0, 40)  # rendered in hex from addr_hi (bits 16-23) and addr_lo (bits 32-63)

REGISTERS: dict[tuple[bool, int], Register] = {}
for _code, (_name, _spec) in _OPS0.items():
    REGISTERS[(False, _code)] = Register(_code, _name, True, False, _f(_spec))
for _code, (_name, _spec) in _SET0.items():
    REGISTERS[(False, _code)] = Register(_code, _name, False, False, _f(_spec))
for _code, _name in _ADDRESSES.items():
    REGISTERS[(True, _code)] = Register(_code, _name, False, True, (ADDRESS,))
for _code, (_name, _spec) in _SET1.items():
    REGISTERS[(True, _code)] = Register(_code, _name, False, True, _f(_spec))
for _code, (_name, _spec) in _OPS1.items():
    REGISTERS[(True, _code)] = Register(_code, _name, True, True, _f(_spec))

OP_KINDS = ("CONV", "DEPTHWISE", "POOL", "ELEMENTWISE", "RESIZE", "DMA_START", "BRANCH")
COMMANDS = CommandSet(
    ops={c: r.name for (long, c), r in REGISTERS.items() if r.is_op and not long},
    long_ops={c: r.name for (long, c), r in REGISTERS.items() if r.is_op and long},
    cmd0={c: r.name for (long, c), r in REGISTERS.items() if not r.is_op and not long},
    cmd1={c: r.name for (long, c), r in REGISTERS.items() if not r.is_op and long},
    kinds=OP_KINDS,
)


BY_NAME = {r.name: r for r in REGISTERS.values()}


def field(reg: str, name: str, param: int, data: int = 0) -> int:
    """One field of a register from its 16-bit parameter (and cmd1 payload)."""
    f = next(f for f in BY_NAME[reg].fields if f.name == name)
    return f.get(param << 16 | data << 32)


@dataclass
class Disassembled:
    offset: int  # bytes into the command stream
    name: str  # NPU_SET_... / NPU_OP_...
    param: int
    fields: dict[str, str]


def disassemble(words: np.ndarray, where: str = "command stream") -> list[Disassembled]:
    """Every command with its fields rendered as Vela's verbose listing shows them (unknown codes: '****')."""
    out: list[Disassembled] = []
    i, n = 0, len(words)
    while i < n:
        w = int(words[i])
        code, long, param = w & 0x3FF, (w >> 14) & 3 == 1, w >> 16
        data = 0
        if long:
            if i + 1 >= n:
                raise InputError(f"truncated command at word {i}", where)
            data = int(words[i + 1])
        reg = REGISTERS.get((long, code))
        value = w | data << 32
        if reg is None:
            out.append(Disassembled(4 * i, f"****{code:#05x}", param, {}))
        elif reg.fields == (ADDRESS,):
            out.append(Disassembled(4 * i, reg.full_name, param, {"addr": hex((param & 0xFF) << 32 | data)}))
        else:
            out.append(Disassembled(4 * i, reg.full_name, param, {f.name: f.render(value) for f in reg.fields}))
        i += 2 if long else 1
    return out
