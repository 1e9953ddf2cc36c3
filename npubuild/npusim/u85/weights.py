"""U85 weights: the fast weight stream (FWD) decoder, the U85 weight traversal per core, and scale entries.

Two stream formats (WEIGHT_FORMAT): SWD, the standard format shared with U55/U65 (decoded by
npusim.weights.decode_stream), one stream per core at WEIGHT_BASE, WEIGHT1_BASE..; and FWD, one stream
for all cores: a 256-bit header (bit 0 raw mode, bit 1 two-bit palette, bits 104-111 a signed
zero adjust for raw mode, then 16 nine-bit palette entries, sign in the low bit) followed by the
weights, 8 bits each in raw mode or 2/4-bit palette indices, LSB first, padded to 256 bits.

The values come in the order the MAC array consumes them: OFM blocks; IFM blocks, walked forwards
and backwards on alternate OFM blocks; 8x8 sub-kernels (smaller when dilated); IFM and OFM
micro-blocks; stride phases (part-kernel and depthwise orders); kernel rows, each walked in
alternate directions; then IFM micro-block slices of 8 (16 with 2:4 sparsity), OFM channels in
groups of 4 dealt to the cores in turn, and IFM channels. Part-kernel and depthwise orders pad each
sub-kernel to a multiple of 5 or 10 elements. `stream_order` gives, for every position of one core's
stream, the OHWI weight it holds (or -1 for padding); an FWD stream interleaves the cores' streams in
blocks of one padded sub-kernel group.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from npubuild.errors import StageError

DEPTH_FIRST, PART_KERNEL, DEPTHWISE = "depth_first", "part_kernel", "depthwise"
INTERLEAVE = 4  # OFM channels dealt to one core at a time
FWD_HEADER_BITS = 256


@dataclass(frozen=True)
class Layout:
    """Everything that fixes the order of an op's weights: shapes, traversal and the block configuration."""

    ofm_depth: int
    kh: int
    kw: int
    ifm_depth: int  # 1 for depthwise
    traversal: str
    ifm_bits: int
    macs: int
    cores: int
    ofm_block_depth: int
    ofm_ublock_depth: int
    ifm_block_depth: int
    stride_y: int = 1
    stride_x: int = 1
    dilation_y: int = 1
    dilation_x: int = 1
    sparse: bool = False

    @property
    def ifm_ublock_depth(self) -> int:
        if self.traversal == PART_KERNEL:
            return 8 if self.ifm_bits == 16 and not self.sparse else self.ifm_block_depth
        return 1 if self.traversal == DEPTHWISE else self.ifm_block_depth

    @property
    def sub_kernel_round(self) -> int:
        """Part-kernel and depthwise orders pad every sub-kernel to a multiple of this many elements."""
        if self.traversal == PART_KERNEL:
            return 10 if self.ifm_bits == 16 or self.sparse else 5
        return 10 if self.traversal == DEPTHWISE else 1

    @property
    def depthwise_padding(self) -> int:
        """Extra zero elements after every 10 depthwise kernel elements (wider MAC arrays read more)."""
        if self.ifm_bits != 16 and self.macs <= 256:
            return 0
        return 2 if self.macs <= 512 else 6


def ifm_block_depth(part_kernel: bool, ifm_bits: int, macs: int, ofm_ublock_depth: int, sparse: bool) -> int:
    """The IFM block depth of a convolution's weight traversal (the hardware's fixed choice per configuration)."""
    if part_kernel:
        return 16
    if ifm_bits == 32 or (macs in (128, 256) and ofm_ublock_depth == 16 and not sparse):
        return 32
    return 128 if sparse and ifm_bits == 8 else 64


def _elements(sub_h: int, sub_w: int, sy: int, sx: int) -> tuple[np.ndarray, np.ndarray]:
    """Kernel positions of one sub-kernel in traversal order: stride phases, rows, alternate-direction columns."""
    ys, xs = [], []
    for py in range(sy):
        rows = (sub_h + sy - 1 - py) // sy
        for px in range(sx):
            cols = (sub_w + sx - 1 - px) // sx
            for ky in range(rows):
                for kx in range(cols):
                    x = kx if ky % 2 == 0 else cols - 1 - kx
                    ys.append(py + ky * sy)
                    xs.append(px + x * sx)
    return np.asarray(ys, np.int64), np.asarray(xs, np.int64)


@lru_cache(maxsize=512)
def stream_order(lay: Layout, stream: int = 0) -> np.ndarray:
    """For each value of core `stream`'s weight stream, the flat OHWI index it holds, or -1 (zero padding)."""
    dw = lay.traversal == DEPTHWISE
    sy, sx = (1, 1) if lay.traversal == DEPTH_FIRST else (lay.stride_y, lay.stride_x)
    decomp_y, decomp_x = 8 // lay.dilation_y, 8 // lay.dilation_x
    iub, oub, rnd = lay.ifm_ublock_depth, lay.ofm_ublock_depth, lay.sub_kernel_round
    step = 1 if dw else (16 if lay.sparse else 8)
    # one kernel element's values: [ifm slice][ofm group of this core][ofm in group][ifm in slice]
    i_off = (np.arange(0, iub, step)[:, None, None, None] + np.arange(step)[None, None, None, :])
    o_off = (np.arange(stream * INTERLEAVE, oub, INTERLEAVE * lay.cores)[None, :, None, None]
             + np.arange(INTERLEAVE)[None, None, :, None])
    i_off, o_off = np.broadcast_arrays(i_off, o_off)
    i_off, o_off = i_off.ravel(), o_off.ravel()

    pad_unit = iub * oub // lay.cores  # zeros per missing kernel element
    dw_pad = lay.depthwise_padding * oub // lay.cores if dw else 0
    chunks: list[np.ndarray] = []
    ifm_limit = 1 if dw else lay.ifm_depth
    inc, ifm_start = -lay.ifm_block_depth, 0
    for ofm_block in range(0, lay.ofm_depth, lay.ofm_block_depth):
        inc = -inc
        ofm_clip = min(lay.ofm_block_depth, lay.ofm_depth - ofm_block)
        ifm_block = ifm_start
        while 0 <= ifm_block < ifm_limit:
            ifm_start = ifm_block
            ifm_clip = 1 if dw else min(lay.ifm_block_depth, lay.ifm_depth - ifm_block)
            for sub_x in range(0, lay.kw, decomp_x):
                sub_w = min(lay.kw - sub_x, decomp_x)
                for sub_y in range(0, lay.kh, decomp_y):
                    sub_h = min(lay.kh - sub_y, decomp_y)
                    ey, ex = _elements(sub_h, sub_w, sy, sx)
                    n_el = len(ey)
                    padded = -(-n_el // rnd) * rnd
                    wy, wx = sub_y + ey, sub_x + ex
                    for ifm_outer in range(0, ifm_clip, iub):
                        for ofm_outer in range(0, ofm_clip, oub):
                            ifm = ifm_block + ifm_outer + i_off[None, :]
                            ofm = ofm_block + ofm_outer + o_off[None, :]
                            ok = (ifm < lay.ifm_depth) & (ofm < lay.ofm_depth)
                            flat = ((ofm * lay.kh + wy[:, None]) * lay.kw + wx[:, None]) * lay.ifm_depth + ifm
                            block = np.where(ok, flat, -1)  # (n_el, per_element)
                            if dw_pad:
                                # padding after the elements that leave a multiple of `rnd` still to go
                                for k in range(n_el):
                                    chunks.append(block[k])
                                    if (padded - k - 1) % rnd == 0:
                                        chunks.append(np.full(dw_pad, -1, np.int64))
                            else:
                                chunks.append(block.ravel())
                            remaining = padded - n_el
                            if remaining:
                                extra = lay.depthwise_padding if dw else 0
                                chunks.append(np.full((remaining + extra) * pad_unit, -1, np.int64))
            ifm_block += inc
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int64)


@lru_cache(maxsize=512)
def fwd_order(lay: Layout) -> np.ndarray:
    """The single FWD stream of all cores: each core's stream in turn, one block (a padded group) at a time."""
    if lay.cores == 1:
        return stream_order(lay, 0)
    if lay.traversal == DEPTHWISE:
        raise StageError("the fast weight format has no depthwise order")
    rnd = 1 if lay.traversal == DEPTH_FIRST else (10 if lay.ifm_bits == 16 or lay.sparse else 5)
    block = lay.ofm_ublock_depth * lay.ifm_ublock_depth * rnd // lay.cores
    streams = [stream_order(lay, s) for s in range(lay.cores)]
    n = len(streams[0])
    if any(len(s) != n for s in streams) or n % block:
        raise StageError("the cores' weight streams do not interleave in whole blocks")
    return np.stack([s.reshape(-1, block) for s in streams], axis=1).ravel()


def decode_fwd(data: bytes, count: int) -> np.ndarray:
    """The first `count` weights of a fast-weight-format stream."""
    if len(data) < FWD_HEADER_BITS // 8:
        raise StageError(f"fast weight stream of {len(data)} bytes has no header")
    head = int.from_bytes(data[:32], "little")
    raw, small = head & 1, head >> 1 & 1
    zero_adjust = (head >> 104 & 0xFF) ^ 0x80
    zero_adjust -= 0x80
    folded = np.array([head >> (112 + 9 * i) & 0x1FF for i in range(16)], np.int64)
    palette = np.where(folded & 1, -(folded >> 1), folded >> 1)
    body = np.frombuffer(data[32:], np.uint8)
    bits = 8 if raw else 2 if small else 4
    if len(body) * 8 < count * bits:
        raise StageError(f"fast weight stream has {len(body) * 8 // bits} weights, the op needs {count}")
    if raw:
        return (body[:count].astype(np.int8).astype(np.int64) - zero_adjust).astype(np.int16)
    per_byte = 8 // bits
    idx = (body[:, None] >> (np.arange(per_byte) * bits)) & ((1 << bits) - 1)
    return palette[idx.ravel()[:count]].astype(np.int16)


def unpack(values: np.ndarray, order: np.ndarray, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Stream values placed at their OHWI positions (positions the order does not reach stay zero)."""
    if len(values) < len(order):
        raise StageError(f"weight stream has {len(values)} values, the op needs {len(order)}")
    out = np.zeros(int(np.prod(shape)), np.int64)
    used = order >= 0
    out[order[used]] = values[: len(order)][used]
    return out.reshape(shape)


def decode_scales(data: bytes, n: int, acc48: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n 10-byte entries: bias (32 bits, or 48 with a 48-bit accumulator), multiplier (31 or 15 bits), shift."""
    if len(data) < 10 * n:
        raise StageError(f"scale stream has {len(data)} bytes, {n} channels need {10 * n}")
    raw = np.frombuffer(data[: 10 * n], np.uint8).reshape(n, 10).astype(np.int64)
    nbias = 6 if acc48 else 4
    bias = sum(raw[:, k] << (8 * k) for k in range(nbias))
    bias = np.where(bias >= 1 << (8 * nbias - 1), bias - (1 << (8 * nbias)), bias)
    mult = sum(raw[:, nbias + k] << (8 * k) for k in range(8 - nbias))
    mult = mult & ((1 << (8 * (8 - nbias) - 1)) - 1)
    return bias, mult, raw[:, 8] & 0x3F
