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
    """LSB-first bit reader over a bytes object (slice headers; `_slice` reads the chunks through `windows`)."""

    def __init__(self, data: bytes):
        self.data = data + b"\0" * 8
        self.size = len(data)
        self.pos = 0
        self._windows: tuple[np.ndarray, list[int]] | None = None

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

    def windows(self) -> tuple[np.ndarray, list[int]]:
        """The 32 bits from every byte on (zeros past the end, with room for one chunk's reads past it): any
        field of up to 25 bits at bit p is w[p >> 3] >> (p & 7); as an array (numpy gathers) and a list (the
        chunk walk's reads: indexing a list is several times cheaper than a numpy scalar)."""
        if self._windows is None:
            b = np.frombuffer(self.data + b"\0" * (_PAST_END - 8 + 3), np.uint8).astype(np.int64)
            w = b[:-3] | b[1:-2] << 8 | b[2:-1] << 16 | b[3:] << 24
            self._windows = w, w.tolist()
        return self._windows


_PAST_END = 64  # bytes of zeros after the stream: a chunk's reads start at most 36 bits past the last checked bit


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
           uncompressed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Decode one slice's chunks: unary parts of a chunk precede the remainders of the previous chunk.

    Where a chunk starts depends on how many symbols the two before it had, so the walk over chunks is
    sequential; it runs in Python but only counts symbols (popcounts of the unary words) and notes each
    chunk's unary words and where its remainders are. numpy then turns the words into quotients and reads
    every remainder (`_weight_quotients`, `_zero_run_quotients`, `_values`): the per-value work."""
    if not (zero_run or uncompressed):
        return _dense_slice(bb, nw, wdiv, wtrunc), np.zeros(0, np.int64)
    windows, win = bb.windows()
    limit, pos = 8 * bb.size, bb.pos
    z_len = 12 if zdiv < 3 else 8
    w_max = 8 if uncompressed and wdiv > 5 else 12
    z_mask = (1 << z_len) - 1
    pop, masks = _POPCOUNT, _UNARY1_MASK
    w_words: list[int] = []  # unary0 | unary1 << 12 of every weight chunk
    z_words: list[int] = []
    w_at: list[int] = []  # per chunk whose remainders are read: bit position, count
    w_n: list[int] = []
    z_at: list[int] = []
    z_n: list[int] = []
    w_pos = z_pos = w_done = z_done = n_w = n_z = 0
    w_last = z_last = 0  # symbols of the previous chunk (0 also when it had none of that kind)
    w_on = z_on = False
    w_n_max = w_max if wtrunc else 0  # symbols in a weight chunk: w_max less its code 2s, or all when truncated
    while True:
        if zero_run:
            balance = w_pos - z_pos
            w_on = balance < 8 and w_pos < nw
            z_on = balance >= 0 and z_pos < nz
        else:
            w_on = w_pos < nw
        unary0 = 0
        if w_on and not uncompressed:
            unary0 = win[pos >> 3] >> (pos & 7) & 0xFFF
            pos += 12
        if z_on:
            word = win[pos >> 3] >> (pos & 7) & z_mask
            pos += z_len
            z_words.append(word)
            n_z = z_len - pop[word]  # a 0 ends a symbol
            z_pos += n_z
        if w_on:
            unary1 = win[pos >> 3] >> (pos & 7) & masks[unary0]
            pos += pop[unary0]
            w_words.append(unary0 | unary1 << 12)
            n_w = w_n_max or w_max - pop[unary1]  # every code 2 (a 1 in unary1) continues a symbol
            w_pos += n_w
        if w_last:  # all of the previous chunk's remainders, but in the last chunk (w_done < nw here)
            c = w_last if w_done + w_last <= nw else nw - w_done
            w_at.append(pos)
            w_n.append(c)
            pos += c * wdiv
            w_done += c
        if z_last:
            c = z_last if z_done + z_last <= nz else nz - z_done
            z_at.append(pos)
            z_n.append(c)
            pos += c * zdiv
            z_done += c
        if pos > limit:
            raise StageError(f"weight stream overrun at bit {limit}")
        if not (w_on or z_on):
            break
        w_last = n_w if w_on else 0
        z_last = n_z if z_on else 0
    bb.pos = pos
    w_vals = _values(windows, _weight_quotients(w_words, w_max, wtrunc)[:nw], w_at, w_n, wdiv)
    if not zero_run:
        return w_vals, np.zeros(0, np.int64)
    return w_vals, _values(windows, _zero_run_quotients(z_words, z_len)[:nz], z_at, z_n, zdiv)


def _dense_slice(bb: _Bits, nw: int, wdiv: int, wtrunc: bool) -> np.ndarray:
    """`_slice` without zero runs and with unary words (most of a dense model's weights): every chunk is twelve
    weight positions, its unary words (one 32-bit read), then the previous chunk's remainders, all of them but
    in the last chunk."""
    windows, win = bb.windows()
    pop, masks = _POPCOUNT, _UNARY1_MASK
    pos, w_pos, last = bb.pos, 0, 0
    words: list[int] = []
    at: list[int] = []  # where each chunk's unary words end: the previous chunk's remainders start there
    try:
        while w_pos < nw:
            bits = win[pos >> 3] >> (pos & 7)
            unary0 = bits & 0xFFF
            unary1 = bits >> 12 & masks[unary0]
            words.append(unary0 | unary1 << 12)
            pos += 12 + pop[unary0]
            at.append(pos)
            pos += last * wdiv
            last = 12 if wtrunc else 12 - pop[unary1]
            w_pos += last
    except IndexError:  # ran past the zeros after the stream
        pos = len(win) * 8
    final = nw - (w_pos - last)  # the last chunk's remainders that are values
    at.append(pos)
    pos += final * wdiv
    if pos > 8 * bb.size:
        raise StageError(f"weight stream overrun at bit {8 * bb.size}")
    bb.pos = pos
    w = np.asarray(words, np.int64)
    n = np.full(len(w), 12, np.int64) if wtrunc else 12 - _POPCOUNT_NP[w >> 12]
    counts = np.concatenate([[0], n[:-1], [final]])
    return _values(windows, _weight_quotients(w, 12, wtrunc)[:nw], at, counts, wdiv)


def _segment_sums(codes: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sum of the codes of each symbol, a symbol running up to and including each end (a symbol a chunk leaves
    unfinished goes on in the next chunk: the codes are one stream; an unfinished last symbol is dropped)."""
    total = np.cumsum(codes)[ends]
    return np.diff(total, prepend=0)


def _weight_quotients(words: list[int] | np.ndarray, length: int, trunc: bool) -> np.ndarray:
    """The weight quotients of a slice's chunks: per chunk position, code 0, or 1 + the next unary1 bit where
    unary0 has a 1; a symbol ends at a code below 2 (at every code when truncated)."""
    w = np.asarray(words, np.int64)[:, None]
    k = np.arange(length)
    bit0 = w >> k & 1
    used = np.cumsum(bit0, axis=1) - bit0  # unary1 bits used before each position
    codes = (bit0 + (bit0 & w >> (12 + used))).ravel()
    return _segment_sums(codes, slice(None) if trunc else codes < 2)


def _zero_run_quotients(words: list[int], length: int) -> np.ndarray:
    """The zero-run quotients of a slice's chunks: a 1 bit counts, a 0 bit ends a symbol."""
    bits = (np.asarray(words, np.int64)[:, None] >> np.arange(length) & 1).ravel()
    return _segment_sums(bits, bits == 0)


def _values(windows: np.ndarray, q: np.ndarray, at: list[int], n: list[int] | np.ndarray, div: int) -> np.ndarray:
    """(q << div) | remainder for every value, the remainders read at their chunks' bit positions."""
    if not div or not len(q):
        return q
    counts = np.asarray(n, np.int64)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    bit = np.repeat(np.asarray(at, np.int64), counts) + (np.arange(len(q)) - first) * div
    return q << div | windows[bit >> 3] >> (bit & 7) & ((1 << div) - 1)


_POPCOUNT = [bin(i).count("1") for i in range(1 << 12)]
_POPCOUNT_NP = np.asarray(_POPCOUNT, np.int64)
_UNARY1_MASK = [(1 << n) - 1 for n in _POPCOUNT]  # unary1's bits after each unary0


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
