"""U85 DMA: 1D, 2D and 3D strided copies, gather (indexed source) and scatter (indexed destination).

DMA0_SRC/DST_REGION: bits 0-2 the region, 8 internal memory (the LUT RAM), 9-10 (source) the stride
mode D1/D2/D3, 11 index mode. D1 copies DMA0_LEN bytes. D2/D3 copy SIZE0 (x SIZE1) rows of LEN bytes,
row (i1, i0) at i1 * STRIDE1 + i0 * STRIDE0 on either side; an indexed side uses the next 32-bit index
from DMA0_IDX (region DMA0_IDX_REGION, each at most DMA0_IDX_MAX) in place of i0, and the index
pointer skips DMA0_IDX_SKIP1 bytes after each row of SIZE0 (how Vela reads the low words of int64 indices).
"""

from __future__ import annotations

import numpy as np

from npubuild.errors import StageError
from npubuild.npusim.cmdstream import Command
from npubuild.npusim.u85.machine_state import Machine

D1, D2, D3 = 0, 1, 2


def _memory(m: Machine, reg: int) -> np.ndarray:
    return m.lut_ram if (reg >> 8) & 1 else m.mem[reg & 7]


def _copy(src: np.ndarray, s: int, dst: np.ndarray, d: int, n: int) -> None:
    """n bytes from src[s:] to dst[d:] (of every sample, for a batched memory)."""
    if s < 0 or d < 0 or s + n > src.shape[-1] or d + n > dst.shape[-1]:
        raise StageError(f"DMA of {n} bytes outside its region (src {s}, dst {d})")
    dst[..., d:d + n] = src[..., s:s + n]


def run_dma(m: Machine, cmd: Command) -> None:
    r = cmd.regs
    src_reg, dst_reg = r.get("DMA0_SRC_REGION", 0), r.get("DMA0_DST_REGION", 0)
    src, dst = _memory(m, src_reg), _memory(m, dst_reg)
    s0, d0, n = cmd.addr("DMA0_SRC"), cmd.addr("DMA0_DST"), cmd.addr("DMA0_LEN")
    mode = (src_reg >> 9) & 3
    src_indexed, dst_indexed = bool((src_reg >> 11) & 1), bool((dst_reg >> 11) & 1)
    if mode == D1 and not (src_indexed or dst_indexed):
        _copy(src, s0, dst, d0, n)
        return
    size0 = r.get("DMA0_SIZE0", 1) or 1
    size1 = (r.get("DMA0_SIZE1", 1) or 1) if mode == D3 else 1
    ss0, ds0 = cmd.addr("DMA0_SRC_STRIDE0"), cmd.addr("DMA0_DST_STRIDE0")
    ss1, ds1 = (cmd.addr("DMA0_SRC_STRIDE1"), cmd.addr("DMA0_DST_STRIDE1")) if mode == D3 else (0, 0)
    if not (src_indexed or dst_indexed):
        _rows(src, s0, ss1, ss0, dst, d0, ds1, ds0, n, size1, size0, None, False, False)
        return
    idx_mem = m.mem[r.get("DMA0_IDX_REGION", 0) & 7]
    ptr, skip, limit = cmd.addr("DMA0_IDX"), cmd.addr("DMA0_IDX_SKIP1") if mode == D3 else 0, r.get("DMA0_IDX_MAX", 0)
    rows = []
    for _ in range(size1):
        if ptr + 4 * size0 > idx_mem.shape[-1]:
            raise StageError("DMA index list outside its region")
        rows.append(np.ascontiguousarray(idx_mem[..., ptr:ptr + 4 * size0]).view("<i4").astype(np.int64))
        ptr += 4 * size0 + skip
    indices = np.stack(rows, axis=-2)  # (..., size1, size0)
    for idx in indices.reshape(-1, size1, size0):  # the first bad sample's, as run alone
        if idx.size and (idx.min() < 0 or idx.max() > limit):
            raise StageError(f"DMA index {int(idx.max())} outside 0..{limit}")
    if indices.ndim == 2 or (indices == indices[0]).all():  # one index list for every sample
        _rows(src, s0, ss1, ss0, dst, d0, ds1, ds0, n, size1, size0, indices.reshape(-1, size1, size0)[0],
              src_indexed, dst_indexed)
        return
    for row, idx in enumerate(indices):  # indices that are data: each sample's own copies
        _rows(src[row], s0, ss1, ss0, dst[row], d0, ds1, ds0, n, size1, size0, idx, src_indexed, dst_indexed)


def _rows(src: np.ndarray, s0: int, ss1: int, ss0: int, dst: np.ndarray, d0: int, ds1: int, ds0: int, n: int,
          size1: int, size0: int, indices: np.ndarray | None, src_indexed: bool, dst_indexed: bool) -> None:
    """The SIZE1 x SIZE0 rows of a 2D/3D copy, an indexed side at the index's row instead of i0."""
    for i1 in range(size1):
        for i0 in range(size0):
            j = int(indices[i1, i0]) if indices is not None else i0
            _copy(src, s0 + i1 * ss1 + (j if src_indexed else i0) * ss0,
                  dst, d0 + i1 * ds1 + (j if dst_indexed else i0) * ds0, n)
