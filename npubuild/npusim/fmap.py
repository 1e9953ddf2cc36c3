"""Feature-map addressing: NHWC and NHCWB16 layouts over up to four tiles, as the hardware sees them.

A feature map is described by BASE0..3, WIDTH0, HEIGHT0/HEIGHT1 and byte
strides. Tile 0 holds x < WIDTH0, y < HEIGHT0; tile 1 x >= WIDTH0, y < HEIGHT1;
tile 2 x < WIDTH0, y >= HEIGHT0; tile 3 the rest (rolling buffers use these).
NHCWB16 stores bricks of 16 channels: (c // 16) steps by STRIDE_C and c % 16
by the element size; NHWC steps c by STRIDE_C.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim.cmdstream import Command

NHWC, NHCWB16 = 0, 1
DTYPES = {(8, True): np.int8, (8, False): np.uint8, (16, True): np.int16, (16, False): np.uint16,
          (32, True): np.int32, (32, False): np.uint32, (64, True): np.int64, (64, False): np.uint64}


@dataclass(frozen=True)
class FeatureMap:
    """One operand of an op: where it lives and how its elements are encoded."""

    region: int
    bases: tuple[int, int, int, int]
    width0: int
    height0: int
    height1: int
    stride_x: int
    stride_y: int
    stride_c: int
    bits: int
    signed: bool
    fmt: int
    zero_point: int
    # (h, w, c) -> _block's addresses: a U55 command stream of thousands of small ops (17021 POOLs for a
    # selfie segmentation) outgrows _block's LRU, so each map keeps its own for the next sample's run
    blocks: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def geometry(self) -> tuple:
        """Every field, in order (FeatureMap(*geometry) is this map): a cache key (dataclasses.astuple deep-copies,
        ten times slower)."""
        return (self.region, self.bases, self.width0, self.height0, self.height1, self.stride_x, self.stride_y,
                self.stride_c, self.bits, self.signed, self.fmt, self.zero_point)

    @property
    def elem(self) -> int:
        return self.bits // 8

    @property
    def dtype(self):
        return DTYPES[(self.bits, self.signed)]

    @property
    def format_name(self) -> str:
        return "NHCWB16" if self.fmt == NHCWB16 else "NHWC"

    def addresses(self, ys: np.ndarray, xs: np.ndarray, cs: np.ndarray) -> np.ndarray:
        """Byte address of element (y, x, c) for the broadcast grid of ys[:,None,None], xs[None,:,None], cs."""
        y = ys[:, None, None].astype(np.int64)
        x = xs[None, :, None].astype(np.int64)
        c = cs[None, None, :].astype(np.int64)
        if self.fmt == NHCWB16:
            coff = (c // 16) * self.stride_c + (c % 16) * self.elem
        else:
            coff = c * self.stride_c
        if (not xs.size or xs.max() < self.width0) and (not ys.size or ys.max() < self.height0):
            # all in tile 0 (most blocks): its base, without the tile arithmetic (a command stream of
            # thousands of small ops spends most of its first pass here)
            return self.bases[0] + y * self.stride_y + x * self.stride_x + coff
        right = x >= self.width0
        bottom = np.where(right, y >= self.height1, y >= self.height0)
        tile = right.astype(np.int64) + 2 * bottom
        base = np.asarray(self.bases, np.int64)[tile]
        ty = np.where(bottom, y - np.where(right, self.height1, self.height0), y)
        tx = np.where(right, x - self.width0, x)
        return base + ty * self.stride_y + tx * self.stride_x + coff


def _precision(cmd: Command, reg: str, ofm: bool) -> tuple[int, bool, int]:
    p = cmd.regs.get(reg, 0)
    signed = bool(p & 1)
    size = (p >> 1) & 3 if ofm else (p >> 2) & 3
    if size > 2:
        raise StageError(f"unsupported {reg} {p:#x}")
    return 8 << size, signed, (p >> 6) & 3


def operand(cmd: Command, prefix: str) -> FeatureMap:
    """The IFM, IFM2 or OFM of an op from its register snapshot (made once per command: callers only read it)."""
    fm = cmd.derived.get(prefix)
    if fm is None:
        fm = cmd.derived[prefix] = _operand(cmd, prefix)
    return fm


def _operand(cmd: Command, prefix: str) -> FeatureMap:
    bits, signed, fmt = _precision(cmd, f"{prefix}_PRECISION", prefix == "OFM")
    r = cmd.regs
    return FeatureMap(
        region=r.get(f"{prefix}_REGION", 0) & 0x7,
        bases=tuple(cmd.addr(f"{prefix}_BASE{i}") for i in range(4)),  # type: ignore[arg-type]
        width0=r.get(f"{prefix}_WIDTH0_M1", 0) + 1,
        height0=r.get(f"{prefix}_HEIGHT0_M1", 0) + 1,
        height1=r.get(f"{prefix}_HEIGHT1_M1", 0) + 1,
        stride_x=r.get(f"{prefix}_STRIDE_X", 0), stride_y=r.get(f"{prefix}_STRIDE_Y", 0),
        stride_c=r.get(f"{prefix}_STRIDE_C", 0),
        bits=bits, signed=signed, fmt=fmt, zero_point=cmd.s16(f"{prefix}_ZERO_POINT"),
    )


@functools.lru_cache(maxsize=4096)
def _block(geometry: tuple, h: int, w: int, c: int) -> tuple[np.ndarray, int, int]:
    """The byte addresses of the (h, w, c) block at the origin of the feature map `geometry` describes
    (FeatureMap.geometry), and their least and greatest: the same for every sample a command stream runs,
    so computed once (a third of DS-CNN's npu-sim time was these grids, four samples over)."""
    addr = FeatureMap(*geometry).addresses(np.arange(h), np.arange(w), np.arange(c))
    addr.flags.writeable = False
    return addr, int(addr.min()) if addr.size else 0, int(addr.max()) if addr.size else 0


def _checked_block(mem: np.ndarray, fm: FeatureMap, h: int, w: int, c: int, what: str) -> np.ndarray:
    block = fm.blocks.get((h, w, c))
    if block is None:
        block = fm.blocks[h, w, c] = _block(fm.geometry(), h, w, c)
    addr, lo, hi = block
    size = mem.shape[-1]
    if addr.size and (lo < 0 or hi + fm.elem > size):
        raise StageError(f"feature map {what} outside its region ({lo}..{hi}, size {size})")
    return addr


def read(mem: np.ndarray, fm: FeatureMap, h: int, w: int, c: int) -> np.ndarray:
    """The (h, w, c) block at the origin of `fm`, as int64; memory with a leading sample axis (a batch of
    samples run at once, npusim.u55.machine.run_samples) gives a block per sample."""
    addr = _checked_block(mem, fm, h, w, c, "read")
    dtype = np.dtype(fm.dtype).newbyteorder("<")
    if fm.elem == 1:
        return _gather(mem, addr).view(dtype).astype(np.int64)
    raw = np.ascontiguousarray(_gather(mem, addr[..., None] + np.arange(fm.elem)))
    return raw.view(dtype)[..., 0].astype(np.int64)


def write(mem: np.ndarray, fm: FeatureMap, values: np.ndarray) -> None:
    """Store an (h, w, c) block (already saturated to the OFM type) at the origin of `fm` (a block per sample
    where memory has a leading sample axis)."""
    h, w, c = values.shape[-3:]
    addr = _checked_block(mem, fm, h, w, c, "write")
    raw = np.ascontiguousarray(values.astype(np.dtype(fm.dtype).newbyteorder("<"))).view(np.uint8)
    if fm.elem == 1:
        _scatter(mem, addr, raw)
    else:
        _scatter(mem, addr[..., None] + np.arange(fm.elem), raw.reshape(*values.shape, fm.elem))


def _gather(mem: np.ndarray, index: np.ndarray) -> np.ndarray:
    """mem[index] (per sample, for a batched memory): numpy's one-array fast path, or `take` along the byte
    axis; `mem[..., index]` and `mem[:, index]` take numpy's general indexing path, 1.3x and 5x slower on a
    320x320 feature map."""
    return mem[index] if mem.ndim == 1 else np.take(mem, index, axis=-1)


def _scatter(mem: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """mem[index] = values, row by row for a batched memory (each row on numpy's one-array fast path: 3x
    faster than `mem[:, index] = values` on a large block; the same element order, so the same last write
    where addresses repeat)."""
    if mem.ndim == 1:
        mem[index] = values
        return
    for row, v in zip(mem, values, strict=True):
        row[index] = v
