"""fmap.read/write through strided views and cached tile-0 grids move the bytes the address grid names.

The oracle is `FeatureMap.addresses` (every element's byte address, tile arithmetic included) with a plain
gather and a C-order scatter (the last write wins where addresses repeat), over seeded random geometries:
NHWC and NHCWB16, 8/16/32-bit, one to four tiles, strides that overlap, memory with and without a sample axis.
"""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.errors import StageError
from npubuild.npusim import fmap
from npubuild.npusim.cmdstream import Command


def _geometry(rng: np.random.Generator) -> tuple[fmap.FeatureMap, tuple[int, int, int]]:
    """A random map and block: mostly packed layouts, some with strides that make elements share bytes."""
    bits = int(rng.choice([8, 16, 32]))
    elem = bits // 8
    fmt = int(rng.integers(0, 2))
    h, w, c = (int(x) for x in rng.integers(1, [7, 7, 40]))
    if rng.random() < 0.3:  # whole NHCWB16 bricks
        c = 16 * int(rng.integers(1, 4))
    if fmt == fmap.NHCWB16:
        bricks = -(-c // 16)
        sx = 16 * elem
        sc = sx * w + int(rng.integers(0, 3)) * 16 * elem
        sy = sc * bricks
    else:
        sc = elem * int(rng.choice([1, 1, 1, 2]))
        sx = sc * c + int(rng.integers(0, 3)) * elem
        sy = sx * w + int(rng.integers(0, 5)) * elem
    if rng.random() < 0.15:  # strides that overlap: a write must fall back to the scatter's order
        sx = int(rng.integers(0, max(sx, 1)))
    tiled = rng.random() < 0.3
    width0 = int(rng.integers(1, w + 1)) if tiled else w + int(rng.integers(0, 3))
    height0 = int(rng.integers(1, h + 1)) if tiled else h + int(rng.integers(0, 3))
    height1 = int(rng.integers(1, h + 1)) if tiled else height0
    tile = sy * h + 64
    bases = (int(rng.integers(0, 64)) * elem, tile * 1, tile * 2, tile * 3)
    fm = fmap.FeatureMap(0, bases, width0, height0, height1, sx, sy, sc, bits, bool(rng.integers(0, 2)), fmt,
                         0)
    return fm, (h, w, c)


def _oracle_read(mem: np.ndarray, fm: fmap.FeatureMap, h: int, w: int, c: int) -> np.ndarray:
    addr = fm.addresses(np.arange(h), np.arange(w), np.arange(c))
    raw = mem[..., addr[..., None] + np.arange(fm.elem)]
    return np.ascontiguousarray(raw).view(np.dtype(fm.dtype).newbyteorder("<"))[..., 0].astype(np.int64)


def _oracle_write(mem: np.ndarray, fm: fmap.FeatureMap, values: np.ndarray) -> None:
    addr = fm.addresses(*(np.arange(n) for n in values.shape[-3:]))
    raw = np.ascontiguousarray(values.astype(np.dtype(fm.dtype).newbyteorder("<"))).view(np.uint8)
    index = (addr[..., None] + np.arange(fm.elem)).ravel()
    for row_mem, row in zip(mem.reshape(-1, mem.shape[-1]), raw.reshape(-1, index.size), strict=True):
        row_mem[index] = row


@pytest.mark.parametrize("seed", range(6))
def test_read_and_write_move_the_bytes_the_address_grid_names(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(150):
        fm, (h, w, c) = _geometry(rng)
        addr = fm.addresses(np.arange(h), np.arange(w), np.arange(c))
        size = int(addr.max()) + fm.elem + int(rng.integers(0, 16))
        lead = () if rng.random() < 0.3 else (int(rng.integers(1, 4)),)
        mem = rng.integers(0, 256, (*lead, size)).astype(np.uint8)
        assert np.array_equal(fmap.read(mem, fm, h, w, c), _oracle_read(mem, fm, h, w, c))
        lo, hi = (-(1 << (fm.bits - 1)), (1 << (fm.bits - 1)) - 1) if fm.signed else (0, (1 << fm.bits) - 1)
        values = rng.integers(lo, hi, (*lead, h, w, c), endpoint=True)
        want = mem.copy()
        _oracle_write(want, fm, values)
        fmap.write(mem, fm, values)
        assert np.array_equal(mem, want)


def test_a_block_past_its_region_is_refused_before_any_byte_moves() -> None:
    fm = fmap.FeatureMap(0, (8, 0, 0, 0), 4, 4, 4, 3, 12, 1, 8, True, fmap.NHWC, 0)
    mem = np.zeros((2, 40), np.uint8)
    with pytest.raises(StageError, match="outside its region"):
        fmap.read(mem, fm, 4, 4, 3)
    with pytest.raises(StageError, match="outside its region"):
        fmap.write(mem, fm, np.ones((2, 4, 4, 3), np.int64))
    assert not mem.any()


def _operand_by_accessors(cmd: Command, prefix: str) -> fmap.FeatureMap:
    """The feature map through Command.addr/s16 register by register (how the fields are defined)."""
    p = cmd.regs.get(f"{prefix}_PRECISION", 0)
    size = (p >> 1) & 3 if prefix == "OFM" else (p >> 2) & 3
    r = cmd.regs
    return fmap.FeatureMap(r.get(f"{prefix}_REGION", 0) & 7, tuple(cmd.addr(f"{prefix}_BASE{i}") for i in range(4)),
                           r.get(f"{prefix}_WIDTH0_M1", 0) + 1, r.get(f"{prefix}_HEIGHT0_M1", 0) + 1,
                           r.get(f"{prefix}_HEIGHT1_M1", 0) + 1, r.get(f"{prefix}_STRIDE_X", 0),
                           r.get(f"{prefix}_STRIDE_Y", 0), r.get(f"{prefix}_STRIDE_C", 0), 8 << size, bool(p & 1),
                           (p >> 6) & 3, cmd.s16(f"{prefix}_ZERO_POINT"))


@pytest.mark.parametrize("prefix", ["IFM", "IFM2", "OFM"])
def test_an_operand_is_its_registers_read_one_by_one(prefix: str) -> None:
    rng = np.random.default_rng(len(prefix))
    names16 = ["REGION", "WIDTH0_M1", "HEIGHT0_M1", "HEIGHT1_M1", "ZERO_POINT"]
    names32 = ["BASE0", "BASE1", "BASE2", "BASE3", "STRIDE_X", "STRIDE_Y", "STRIDE_C"]
    for n in range(300):
        regs = {f"{prefix}_{k}": int(rng.integers(0, 1 << 16)) for k in names16 if rng.random() < 0.9}
        regs.update({f"{prefix}_{k}": int(rng.integers(0, 1 << 32)) for k in names32 if rng.random() < 0.9})
        regs[f"{prefix}_PRECISION"] = int(rng.integers(0, 1 << 16)) & ~(0b1100 if prefix != "OFM" else 0b110) | (
            int(rng.integers(0, 3)) << (2 if prefix != "OFM" else 1))
        hi = {f"{prefix}_{k}": int(rng.integers(0, 1 << 16)) for k in names32 if rng.random() < 0.5}
        cmd = Command(n, 0, "POOL", 0, regs, hi)
        assert fmap.operand(cmd, prefix) == _operand_by_accessors(cmd, prefix)
