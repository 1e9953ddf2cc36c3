"""Command-stream decoding on hand-made words: register snapshots, the driver header, unmodelled features."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from npubuild.errors import InputError
from npubuild.npusim import NotModelled
from npubuild.npusim.cmdstream import decode
from npubuild.npusim.npz import RawModel, TensorPlace, parse_driver_payload
from npubuild.npusim.sim import run


def cmd0(code: int, param: int = 0) -> list[int]:
    return [code | (param & 0xFFFF) << 16]


def cmd1(code: int, data: int, param: int = 0) -> list[int]:
    return [code | 0x4000 | (param & 0xFFFF) << 16, data]


def test_each_op_gets_a_snapshot_of_the_registers():
    words = (cmd0(0x113, 15) + cmd1(0x024, 1234, 7) + cmd0(0x005, 1)   # OFM_DEPTH_M1, OFM_SCALE, POOL AVERAGE
             + cmd0(0x113, 31) + cmd0(0x006, 2) + cmd0(0x000, 0xFFFF) + cmd0(0x002))  # ..., ELEMENTWISE SUB, STOP
    ops = decode(np.array(words, np.uint32))
    assert [(o.kind, o.param) for o in ops] == [("POOL", 1), ("ELEMENTWISE", 2)]  # nothing after STOP
    assert ops[0].regs["OFM_DEPTH_M1"] == 15 and ops[1].regs["OFM_DEPTH_M1"] == 31
    assert ops[0].regs["OFM_SCALE"] == 1234 and ops[0].hi["OFM_SCALE"] == 7
    assert ops[1].offset == 4 * 5


def test_signed_16_bit_parameters():
    ops = decode(np.array(cmd0(0x109, 0xFFF1) + cmd0(0x006, 1), np.uint32))
    assert ops[0].s16("IFM_ZERO_POINT") == -15


def test_driver_header():
    stream = cmd0(0x006, 1) + cmd0(0x000, 0xFFFF)
    config = 7 | 0x18 << 8  # 2^7 MACs, 24 KiB SHRAM, U55
    words = [0x10 << 16 | 1, config, 0, 5, 5, 5, 2 | len(stream) << 16, *stream]
    data = b"COP1" + struct.pack(f"<{len(words)}I", *words)
    got, product, macs, shram = parse_driver_payload(data, "x")
    assert list(got) == stream and (product, macs, shram) == (0, 7, 24)
    with pytest.raises(InputError, match="COP1"):
        parse_driver_payload(b"XXXX" + data[4:], "x")


def test_unmodelled_feature_names_the_op():
    words = (cmd0(0x111) + cmd0(0x112) + cmd0(0x113) + cmd0(0x114, 1) + cmd0(0x105, 1) + cmd0(0x10F, 1)
             + cmd0(0x11F, 1) + cmd0(0x006, 5))  # 1x1x1 int8 IFM/OFM in the arena, ELEMENTWISE LRELU
    model = RawModel("hand-made", "ethos-u55-128", 1, np.array(words, np.uint32), b"", 0, 1, 64, 2, 0, 24,
                     [TensorPlace((1, 1, 1, 1), 1, 1, 32)], [TensorPlace((1, 1, 1, 1), 1, 1, 0)])
    with pytest.raises(NotModelled, match=r"NPU op #0 ELEMENTWISE: ELEMENTWISE LRELU"):
        run(model, [np.zeros((1, 1, 1, 1), np.int8)])
