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
_LE_DTYPES = {k: np.dtype(t).newbyteorder("<") for k, t in DTYPES.items()}


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
    def le_dtype(self) -> np.dtype:
        """The element type, little-endian (memory's byte order)."""
        return _LE_DTYPES[(self.bits, self.signed)]

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


def operand(cmd: Command, prefix: str) -> FeatureMap:
    """The IFM, IFM2 or OFM of an op from its register snapshot (made once per command: callers only read it)."""
    fm = cmd.derived.get(prefix)
    if fm is None:
        fm = cmd.derived[prefix] = _operand(cmd, prefix)
    return fm


# per operand prefix, the names of the registers `_operand` reads, made once (not formatted per op: a U55
# stream of thousands of small ops makes two or three maps for each)
_REGISTERS = {prefix: (f"{prefix}_PRECISION", f"{prefix}_REGION", tuple(f"{prefix}_BASE{i}" for i in range(4)),
                       f"{prefix}_WIDTH0_M1", f"{prefix}_HEIGHT0_M1", f"{prefix}_HEIGHT1_M1", f"{prefix}_STRIDE_X",
                       f"{prefix}_STRIDE_Y", f"{prefix}_STRIDE_C", f"{prefix}_ZERO_POINT")
              for prefix in ("IFM", "IFM2", "OFM")}


def _operand(cmd: Command, prefix: str) -> FeatureMap:
    """`Command.addr`, `Command.s16` and `_precision` written out: the same fields, without a call per register."""
    precision, region, (b0, b1, b2, b3), width0, height0, height1, sx, sy, sc, zero_point = _REGISTERS[prefix]
    r, hi = cmd.regs, cmd.hi
    p = r.get(precision, 0)
    size = (p >> 1) & 3 if prefix == "OFM" else (p >> 2) & 3
    if size > 2:
        raise StageError(f"unsupported {precision} {p:#x}")
    zp = r.get(zero_point, 0)
    return FeatureMap(
        r.get(region, 0) & 0x7,
        (r.get(b0, 0) | (hi.get(b0, 0) & 0xFF) << 32, r.get(b1, 0) | (hi.get(b1, 0) & 0xFF) << 32,
         r.get(b2, 0) | (hi.get(b2, 0) & 0xFF) << 32, r.get(b3, 0) | (hi.get(b3, 0) & 0xFF) << 32),
        r.get(width0, 0) + 1, r.get(height0, 0) + 1, r.get(height1, 0) + 1,
        r.get(sx, 0), r.get(sy, 0), r.get(sc, 0),
        8 << size, bool(p & 1), (p >> 6) & 3, zp - 0x10000 if zp & 0x8000 else zp)


@functools.lru_cache(maxsize=4096)
def _block(geometry: tuple, h: int, w: int, c: int) -> tuple[np.ndarray, int, int]:
    """The byte addresses of the (h, w, c) block at the origin of the feature map `geometry` describes
    (FeatureMap.geometry), and their least and greatest: the same for every sample a command stream runs,
    so computed once (a third of DS-CNN's npu-sim time was these grids, four samples over)."""
    addr = FeatureMap(*geometry).addresses(np.arange(h), np.arange(w), np.arange(c))
    addr.flags.writeable = False
    return addr, int(addr.min()) if addr.size else 0, int(addr.max()) if addr.size else 0


@dataclass(frozen=True)
class _View:
    """A block whose bytes memory holds as one strided array: its shape and byte strides (NHCWB16 whole bricks:
    (h, w, bricks, 16)), and whether no two elements share a byte (then a write through it is a scatter's)."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    disjoint: bool


@dataclass
class _Block:
    """How an (h, w, c) block of a map is read and written: its byte addresses from `base` (`rel`; `addr` the
    absolute ones, made when a gather needs them), their least and greatest, and the strided view of memory
    that holds it where there is one (the block in tile 0, laid out affinely)."""

    rel: np.ndarray
    base: int
    lo: int
    hi: int
    view: _View | None
    _addr: np.ndarray | None = None

    @property
    def addr(self) -> np.ndarray:
        if self._addr is None:
            self._addr = self.rel + self.base if self.base else self.rel
        return self._addr


@functools.lru_cache(maxsize=4096)
def _tile0(stride_y: int, stride_x: int, stride_c: int, fmt: int, elem: int, h: int, w: int, c: int
           ) -> tuple[np.ndarray, int, int, _View | None]:
    """A block in tile 0 (h <= HEIGHT0, w <= WIDTH0): its byte addresses from BASE0 (`FeatureMap.addresses`' tile-0
    grid less the base), least and greatest, and its strided view. Alike for every op of the same strides and
    shape wherever its base is: a U55 stream splits a transpose into thousands of such small copies."""
    fm = FeatureMap(0, (0, 0, 0, 0), w, h, h, stride_x, stride_y, stride_c, 8 * elem, True, fmt, 0)
    rel = fm.addresses(np.arange(h), np.arange(w), np.arange(c))
    rel.flags.writeable = False
    view = _view_of(stride_y, stride_x, stride_c, fmt, elem, h, w, c)
    return rel, int(rel.min()), int(rel.max()), view


def _view_of(stride_y: int, stride_x: int, stride_c: int, fmt: int, elem: int, h: int, w: int, c: int
             ) -> _View | None:
    """The strided view of a tile-0 block, or None where its channels are not one stride apart (NHCWB16 with a
    part brick past the first) or a stride is negative."""
    if fmt == NHCWB16 and c > 16:
        if c % 16:
            return None
        shape, strides = (h, w, c // 16, 16), (stride_y, stride_x, stride_c, elem)
    else:
        shape, strides = (h, w, c), (stride_y, stride_x, elem if fmt == NHCWB16 else stride_c)
    if min(strides) < 0:
        return None
    return _View(shape, strides, _disjoint(shape, strides, elem))


def _disjoint(shape: tuple[int, ...], strides: tuple[int, ...], elem: int) -> bool:
    """Whether no two elements of the strided block share a byte: each axis (by stride) steps past everything
    the smaller ones span (sufficient, not necessary: a block that fails it is written by scatter)."""
    span = elem
    for stride, n in sorted((s, n) for s, n in zip(strides, shape, strict=True) if n > 1):
        if stride < span:
            return False
        span = stride * (n - 1) + span
    return True


def _plan(fm: FeatureMap, h: int, w: int, c: int) -> _Block:
    if h and w and c and h <= fm.height0 and w <= fm.width0:
        rel, lo, hi, view = _tile0(fm.stride_y, fm.stride_x, fm.stride_c, fm.fmt, fm.elem, h, w, c)
        base = fm.bases[0]
        return _Block(rel, base, lo + base, hi + base, view)
    addr, lo, hi = _block(fm.geometry(), h, w, c)
    return _Block(addr, 0, lo, hi, None)


def _checked_block(mem: np.ndarray, fm: FeatureMap, h: int, w: int, c: int, what: str) -> _Block:
    block = fm.blocks.get((h, w, c))
    if block is None:
        block = fm.blocks[h, w, c] = _plan(fm, h, w, c)
    size = mem.shape[-1]
    if block.rel.size and (block.lo < 0 or block.hi + fm.elem > size):
        raise StageError(f"feature map {what} outside its region ({block.lo}..{block.hi}, size {size})")
    return block


def _strided(mem: np.ndarray, fm: FeatureMap, block: _Block) -> np.ndarray | None:
    """The block as a strided array over memory (a block per sample for a batched memory), or None where it has
    no view or memory is not one contiguous buffer."""
    view = block.view
    if view is None or not mem.flags.c_contiguous:
        return None
    return np.ndarray((*mem.shape[:-1], *view.shape), fm.le_dtype, mem, block.base,
                      (*mem.strides[:-1], *view.strides))


def read(mem: np.ndarray, fm: FeatureMap, h: int, w: int, c: int) -> np.ndarray:
    """The (h, w, c) block at the origin of `fm`, as int64; memory with a leading sample axis (a batch of
    samples run at once, npusim.u55.machine.run_samples) gives a block per sample. Through a strided view where
    memory holds the block as one (a copy of it, not a gather of every byte), else by address."""
    block = _checked_block(mem, fm, h, w, c, "read")
    strided = _strided(mem, fm, block)
    if strided is not None:
        return strided.astype(np.int64, order="C").reshape(*mem.shape[:-1], h, w, c)
    addr = block.addr
    dtype = fm.le_dtype
    if fm.elem == 1:
        return _gather(mem, addr).view(dtype).astype(np.int64)
    raw = np.ascontiguousarray(_gather(mem, addr[..., None] + np.arange(fm.elem)))
    return raw.view(dtype)[..., 0].astype(np.int64)


def write(mem: np.ndarray, fm: FeatureMap, values: np.ndarray) -> None:
    """Store an (h, w, c) block (already saturated to the OFM type) at the origin of `fm` (a block per sample
    where memory has a leading sample axis): through a strided view where no two elements share a byte (the
    bytes a scatter writes), else by address."""
    h, w, c = values.shape[-3:]
    block = _checked_block(mem, fm, h, w, c, "write")
    strided = _strided(mem, fm, block) if block.view is not None and block.view.disjoint else None
    if strided is not None:
        np.copyto(strided, values.reshape(strided.shape), casting="unsafe")
        return
    addr = block.addr
    raw = np.ascontiguousarray(values.astype(fm.le_dtype)).view(np.uint8)
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
