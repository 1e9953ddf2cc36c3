"""The Ethos-U55/U65 compressed weight stream: our own decoder, the hardware weight order, scale entries.

The stream is a sequence of slices, each a header (zero-run and weight
Golomb-Rice divisors, length, optional palette) followed by chunks that
interleave unary quotient bits and remainders for weights and zero runs; an
EOS code plus byte alignment ends a section. Decoded values are 9-bit
sign-magnitude palette/direct indices turned back into signed weights. The
weights come out in the order the MAC array consumes them (OFM blocks, IFM
blocks, sub-kernels, micro-blocks), which `weight_order` maps back to OHWI.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from npubuild.errors import StageError

ZDIV_DISABLE, ZDIV_EOS, WDIV_UNCOMPRESSED = 6, 7, 7


class _Bits:
    """LSB-first bit reader over a bytes object."""

    def __init__(self, data: bytes):
        self.data = data + b"\0" * 8
        self.size = len(data)
        self.pos = 0

    def get(self, n: int) -> int:
        if n == 0:
            return 0
        p = self.pos
        if (p + n) > 8 * self.size:
            raise StageError(f"weight stream overrun at bit {p}")
        start = p >> 3
        v = int.from_bytes(self.data[start:start + ((p & 7) + n + 7) // 8], "little") >> (p & 7)
        self.pos = p + n
        return v & ((1 << n) - 1)


def decode_stream(data: bytes) -> np.ndarray:
    """Decode a compressed weight stream to signed int16 weights, in stream order."""
    bb = _Bits(data)
    out: list[np.ndarray] = []
    first = True
    palette: list[int] = []
    palsize = palbits = direct_offset = 0
    prev_zero_run: bool | None = None
    while True:
        zdiv = bb.get(3)
        while zdiv == ZDIV_EOS:
            bb.get((8 - (bb.pos & 7)) & 7)
            first = True
            if bb.pos // 8 >= bb.size:
                break
            zdiv = bb.get(3)
        if bb.pos // 8 >= bb.size:
            break
        if zdiv > 3 and zdiv != ZDIV_DISABLE:
            raise StageError(f"weight stream: bad ZDIV {zdiv} at bit {bb.pos - 3}")
        zero_run = zdiv != ZDIV_DISABLE
        nvalues = bb.get(15) + 1
        wdiv = bb.get(3)
        wtrunc = bb.get(1)
        new_palette = bb.get(1)
        if first and not new_palette:
            raise StageError("weight stream: section starts without a palette")
        first = False
        if not new_palette and prev_zero_run is not None and zero_run != prev_zero_run:
            raise StageError("weight stream: zero-run mode changed without a new palette")
        prev_zero_run = zero_run
        if new_palette:
            direct_offset = bb.get(5)
            palsize = bb.get(5)
            palsize = palsize + 1 if palsize else 0
            palbits = bb.get(3) + 2
            palette = [bb.get(palbits) for _ in range(palsize)]
        uncompressed = wdiv == WDIV_UNCOMPRESSED
        if uncompressed:
            wdiv = max(palsize - 1, 0).bit_length() if palsize else palbits
        elif wdiv > 5:
            raise StageError(f"weight stream: bad WDIV {wdiv}")
        w_vals, z_vals = _slice(bb, nvalues, nvalues + (1 if new_palette else 0), zero_run, zdiv, wdiv,
                                bool(wtrunc), uncompressed)
        out.append(_expand(w_vals, z_vals, palette, palsize, direct_offset, zero_run, bool(new_palette)))
    return np.concatenate(out) if out else np.zeros(0, np.int16)


@lru_cache(maxsize=1024)
def decode_cached(data: bytes) -> np.ndarray:
    """decode_stream, memoised on the stream's bytes: every sample of a verification reuses the decode."""
    out = decode_stream(data)
    out.flags.writeable = False
    return out


def _slice(bb: _Bits, nw: int, nz: int, zero_run: bool, zdiv: int, wdiv: int, wtrunc: bool,
           uncompressed: bool) -> tuple[list[int], list[int]]:
    """Decode one slice's chunks: unary parts of a chunk precede the remainders of the previous chunk."""
    w_vals: list[int] = []
    z_vals: list[int] = []
    w_pos = z_pos = 0
    w_carry = z_carry = 0
    w_prev: list[int] | None = None
    z_prev: list[int] | None = None
    z_len = 12 if zdiv < 3 else 8
    w_max = 8 if uncompressed and wdiv > 5 else 12
    while True:
        balance = w_pos - z_pos if zero_run else 0
        w_on = (balance < 8 or not zero_run) and w_pos < nw
        z_on = balance >= 0 and zero_run and z_pos < nz
        w_q: list[int] = []
        z_q: list[int] = []
        unary0 = bb.get(12) if (w_on and not uncompressed) else 0
        if z_on:
            z_q, z_carry = _with_carry(*_zero_run_symbols(bb.get(z_len), z_len), z_carry)
            z_pos += len(z_q)
        if w_on:
            ones = _POPCOUNT[unary0 & ((1 << w_max) - 1)]
            w_q, w_carry = _with_carry(*_weight_symbols(unary0, bb.get(ones), w_max, wtrunc), w_carry)
            w_pos += len(w_q)
        if w_prev is not None:
            _remainders(bb, w_prev[: nw - len(w_vals)], wdiv, w_vals)
        if z_prev is not None:
            _remainders(bb, z_prev[: nz - len(z_vals)], zdiv, z_vals)
        if not (w_on or z_on):
            break
        w_prev = w_q if w_on else None
        z_prev = z_q if z_on else None
    return w_vals, z_vals


_POPCOUNT = [bin(i).count("1") for i in range(1 << 12)]


def _with_carry(symbols: tuple[int, ...], tail: int, carry: int) -> tuple[list[int], int]:
    """A chunk's quotients with the previous chunk's unfinished count added to the first; the new carry."""
    if not symbols:
        return [], carry + tail
    return [symbols[0] + carry, *symbols[1:]], tail


@lru_cache(maxsize=1 << 16)
def _zero_run_symbols(bits: int, length: int) -> tuple[tuple[int, ...], int]:
    """Unary zero-run quotients of one chunk (a 1 counts, a 0 ends a symbol), and the unfinished count."""
    out, cnt = [], 0
    for k in range(length):
        if bits >> k & 1:
            cnt += 1
        else:
            out.append(cnt)
            cnt = 0
    return tuple(out), cnt


@lru_cache(maxsize=1 << 18)
def _weight_symbols(unary0: int, unary1: int, length: int, trunc: bool) -> tuple[tuple[int, ...], int]:
    """Weight quotients of one chunk from its two unary words (codes 0, 1, 2; 2 continues unless truncated)."""
    out, cnt = [], 0
    for k in range(length):
        code = 0
        if unary0 >> k & 1:
            code = 1 + (unary1 & 1)
            unary1 >>= 1
        cnt += code
        if code < 2 or trunc:
            out.append(cnt)
            cnt = 0
    return tuple(out), cnt


def _remainders(bb: _Bits, quotients: list[int], div: int, out: list[int]) -> None:
    """Append (q << div) + remainder for each quotient; the chunk's remainders are read in one go."""
    if not div:
        out.extend(quotients)
        return
    bits, mask = bb.get(len(quotients) * div), (1 << div) - 1
    out.extend((q << div) | (bits >> (i * div) & mask) for i, q in enumerate(quotients))


def _expand(w_vals: list[int], z_vals: list[int], palette: list[int], palsize: int, direct_offset: int,
            zero_run: bool, new_palette: bool) -> np.ndarray:
    """Palette/direct indices to signed weights, with the zero runs put back in."""
    idx = np.asarray(w_vals, dtype=np.int64)
    if palsize:
        pal = np.asarray(palette, dtype=np.int64)
        val = np.where(idx < palsize, pal[np.minimum(idx, palsize - 1)], idx - palsize + direct_offset)
    else:
        val = idx + direct_offset
    signed = np.where(val & 1, -(val >> 1), val >> 1).astype(np.int16)
    if not zero_run:
        return signed
    z = np.asarray(z_vals, dtype=np.int64)
    lead = int(z[0]) if new_palette else 0
    runs = z[1:] if new_palette else z
    total = lead + len(signed) + int(runs.sum())
    out = np.zeros(total, np.int16)
    pos = lead + np.arange(len(signed)) + np.concatenate([[0], np.cumsum(runs)[:-1]]).astype(np.int64)
    out[pos] = signed
    return out


@dataclass(frozen=True)
class WeightLayout:
    """What the hardware needs to know to consume a stream: the shape and traversal of one core's weights."""

    ofm_depth: int
    kh: int
    kw: int
    ifm_depth: int  # 1 for depthwise
    ofm_block_depth: int
    depthwise: bool
    part_kernel: bool
    ifm_bits: int
    ofm_ublock: int
    ifm_ublock: int
    decomp_h: int = 8
    decomp_w: int = 8


@lru_cache(maxsize=1024)
def weight_order(lay: WeightLayout) -> np.ndarray:
    """For each position of the decoded stream, the flat OHWI index it feeds, or -1 for padding (the same for
    every sample a verification runs: computed once per layout, read only)."""
    order = _weight_order(lay)
    order.flags.writeable = False
    return order


def _weight_order(lay: WeightLayout) -> np.ndarray:
    o_n, kh, kw, i_n = lay.ofm_depth, lay.kh, lay.kw, lay.ifm_depth
    ifm_block = 16 if (lay.part_kernel or lay.ifm_bits == 16) else 32
    chunks: list[np.ndarray] = []
    for ob in range(0, o_n, lay.ofm_block_depth):
        ob_depth = min(lay.ofm_block_depth, o_n - ob)
        for ib in range(0, 1 if lay.depthwise else i_n, ifm_block):
            if lay.depthwise:
                ib_depth = lay.ifm_ublock
            else:
                ib_depth = min(ifm_block, i_n - ib) if lay.part_kernel else ifm_block
            for sy in range(0, kh, lay.decomp_h):
                sub_h = min(kh - sy, lay.decomp_h)
                for sx in range(0, kw, lay.decomp_w):
                    sub_w = min(kw - sx, lay.decomp_w)
                    elems = sub_w * sub_h
                    if lay.part_kernel:
                        elems = -(-elems // (2 if lay.ifm_bits == 16 else 4)) * (2 if lay.ifm_bits == 16 else 4)
                    elif lay.depthwise:
                        elems = -(-elems // 4) * 4
                    outer = ib_depth if lay.part_kernel else 1
                    inner = 1 if lay.part_kernel else ib_depth
                    e = np.arange(elems)
                    ky, kx = e // sub_w, e % sub_w
                    inner_u = np.arange(0, inner, lay.ifm_ublock)
                    oz = np.arange(lay.ofm_ublock)
                    iz = np.arange(1 if lay.depthwise else lay.ifm_ublock)
                    for io in range(0, outer, lay.ifm_ublock):
                        for ou in range(0, ob_depth, lay.ofm_ublock):
                            # axes: element, inner ublock, ofm ublock z, ifm ublock z
                            y = (sy + ky)[:, None, None, None]
                            x = (sx + kx)[:, None, None, None]
                            ifm = ib + io + inner_u[None, :, None, None] + iz[None, None, None, :]
                            ofm = ob + ou + oz[None, None, :, None]
                            ok = (ifm < i_n) & (ofm < o_n) & (ky < sub_h)[:, None, None, None]
                            if lay.depthwise:
                                ok = ok & (ofm < ob + ob_depth)
                            flat = ((ofm * kh + y) * kw + x) * i_n + ifm
                            chunks.append(np.where(ok, flat, -1).ravel())
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int64)


def unpack_weights(stream: np.ndarray, lay: WeightLayout) -> np.ndarray:
    """Decoded stream values -> OHWI int16 weights."""
    order = weight_order(lay)
    if len(stream) < len(order):
        raise StageError(f"weight stream has {len(stream)} values, the op needs {len(order)}")
    out = np.zeros(lay.ofm_depth * lay.kh * lay.kw * lay.ifm_depth, np.int16)
    used = order >= 0
    out[order[used]] = stream[: len(order)][used]
    return out.reshape(lay.ofm_depth, lay.kh, lay.kw, lay.ifm_depth)


def decode_scales(data: bytes, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n 10-byte entries: 40-bit signed bias, 32-bit unsigned multiplier, 6-bit shift."""
    if len(data) < 10 * n:
        raise StageError(f"scale stream has {len(data)} bytes, {n} channels need {10 * n}")
    raw = np.frombuffer(data[: 10 * n], np.uint8).reshape(n, 10).astype(np.int64)
    bias = sum(raw[:, k] << (8 * k) for k in range(5))
    bias = np.where(bias >= 1 << 39, bias - (1 << 40), bias)
    mult = sum(raw[:, 5 + k] << (8 * k) for k in range(4))
    shift = raw[:, 9] & 0x3F
    return bias, mult, shift
