"""The weight-stream decoder as npu-sim had it before it was made fast (pure Python, a value at a time): the
reference the fast one (npubuild.npusim.weights.decode_stream) must match on every stream, kept verbatim."""

from __future__ import annotations

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
