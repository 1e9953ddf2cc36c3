"""Our U85 weight decoding against Vela's output: for a compiled conv, the weights decoded from its stream(s) are
exactly the TOSA graph's weights, for each stream format (standard, fast raw / 2-bit / 4-bit palette, 2:4 sparse),
traversal (depth first, part kernel with stride, depthwise) and core count; and the fast format itself on
hand-made streams. Scale entries decode for 32- and 48-bit accumulators."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from npbtest.npusim import lower_int, vela_raw
from npbtest.ops import rand, single_op_model
from tosa.TosaGraph import TosaGraph

from npubuild.errors import StageError
from npubuild.npusim.cmdstream import decode
from npubuild.npusim.memory import region_memory
from npubuild.npusim.npu_op import kernel_of, ofm_shape
from npubuild.npusim.npz import load_raw
from npubuild.npusim.u85 import weights as wts
from npubuild.npusim.u85.conv import weights_of
from npubuild.npusim.u85.dma import run_dma
from npubuild.npusim.u85.machine_state import Machine
from npubuild.npusim.u85.registers import COMMANDS


def _fold(v: int) -> int:
    return abs(v) << 1 | (v < 0)


def fwd_stream(values: list[int], mode: str, palette: list[int] | None = None, zero_adjust: int = 0) -> bytes:
    """A fast-weight-format stream written from the format's description (header, then the packed body)."""
    head = (mode == "raw") | (mode == "lut2") << 1 | (zero_adjust & 0xFF) << 104
    for i, p in enumerate(palette or []):
        head |= _fold(p) << (112 + 9 * i)
    bits = {"raw": 8, "lut2": 2, "lut4": 4}[mode]
    body = 0
    for i, v in enumerate(values):
        code = (v + zero_adjust) & 0xFF if mode == "raw" else palette.index(v)
        body |= code << (bits * i)
    nbytes = -(-(len(values) * bits) // 256) * 32
    return head.to_bytes(32, "little") + body.to_bytes(nbytes, "little")


@pytest.mark.parametrize("mode", ["raw", "raw_adjusted", "lut2", "lut4"])
def test_fast_weight_format_decodes_each_mode(mode):
    rng = np.random.default_rng(3)
    if mode.startswith("raw"):
        adjust = 55 if mode == "raw_adjusted" else 0
        values = rng.integers(-128 - adjust, 128 - adjust, 300).tolist()  # the range a zero adjust shifts into int8
        stream = fwd_stream(values, "raw", zero_adjust=adjust)
    else:
        palette = [-255, 3, 0, 200] if mode == "lut2" else list(range(-8, 8))
        values = rng.choice(palette, 300).tolist()
        stream = fwd_stream(values, mode, palette)
    np.testing.assert_array_equal(wts.decode_fwd(stream, 300), values)
    with pytest.raises(StageError):
        wts.decode_fwd(stream[:40], 300)


def _tosa_weights(tosa: bytes, shape: tuple[int, ...]) -> np.ndarray:
    block = TosaGraph.GetRootAs(bytearray(tosa), 0).Regions(0).Blocks(0)
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        if tuple(t.Shape(j) for j in range(t.ShapeLength())) == shape and t.DataLength():
            return np.frombuffer(bytes(t.DataAsNumpy()), np.int8).reshape(shape).astype(np.int64)
    raise AssertionError(f"no {shape} constant in the graph")


def _decoded_weights(npz: Path) -> list[tuple[object, np.ndarray]]:
    """Every CONV/DEPTHWISE op and the weights decoded for it (DMAs before it replayed, as the NPU would)."""
    model = load_raw(npz)
    m = Machine(region_memory(model), int(model.accelerator.rsplit("-", 1)[1]), model.ncores)
    out = []
    for cmd in decode(model.commands, "x", COMMANDS):
        if cmd.kind == "DMA_START":
            run_dma(m, cmd)
        elif cmd.kind in ("CONV", "DEPTHWISE"):
            oh, ow, oc = ofm_shape(cmd)
            ic = cmd.regs.get("IFM_DEPTH_M1", 0) + 1
            ifm_bits = 8 << ((cmd.regs.get("IFM_PRECISION", 0) >> 2) & 3)
            out.append((cmd, weights_of(m, cmd, kernel_of(cmd), oc, ic, cmd.kind == "DEPTHWISE", ifm_bits)))
    return out


def _levels(n: int, shape, seed: int) -> np.ndarray:
    """Weights on n levels (every output channel reaching +-0.5, so each quantises to the same n integers)."""
    w = np.random.default_rng(seed).choice(np.linspace(-0.5, 0.5, n), shape).astype(np.float32)
    w[:, 0, 0, 0] = 0.5
    return w


def _sparse(shape, seed: int) -> np.ndarray:
    """2:4 sparse along the input channels: two of every four consecutive weights zero."""
    w = rand(shape, seed, -0.5, 0.5)
    keep = np.zeros(shape, bool)
    for o in range(shape[0]):
        for i0 in range(0, shape[1], 4):
            keep[o, i0 + np.random.default_rng(seed + o + i0).choice(4, 2, replace=False)] = True
    return np.where(keep, w, 0).astype(np.float32)


CASES = {  # name: (cin, cout, k, stride, group, weights, accelerator, flags, expected (format, sparse, traversal))
    "fwd_raw_part_kernel": (16, 32, 3, 1, 1, None, "ethos-u85-256", (), ("FWD", 0, "PK")),
    "fwd_lut2_4cores": (64, 64, 1, 1, 1, 4, "ethos-u85-2048", ("--optimise", "Size"), ("FWD", 0, "DF")),
    "fwd_lut4_2cores": (64, 64, 1, 1, 1, 16, "ethos-u85-512", (), ("FWD", 0, "DF")),
    "fwd_lut4_4cores": (64, 64, 1, 1, 1, 16, "ethos-u85-1024", ("--optimise", "Size"), ("FWD", 0, "DF")),
    "swd_4cores_stride2": (40, 72, 3, 2, 1, None, "ethos-u85-2048", (), ("SWD", 0, "PK")),
    "swd_2cores_deep": (200, 70, 3, 1, 1, None, "ethos-u85-512", (), ("SWD", 0, "PK")),
    "swd_depth_first": (130, 130, 1, 1, 1, None, "ethos-u85-1024", (), ("SWD", 0, "DF")),
    "swd_sparse": (64, 32, 1, 1, 1, "sparse", "ethos-u85-256", (), ("SWD", 1, None)),
    "depthwise_k5_4cores": (48, 48, 5, 1, 48, None, "ethos-u85-1024", (), ("SWD", 0, None)),
    "depthwise_k3s2": (24, 24, 3, 2, 24, None, "ethos-u85-128", (), ("SWD", 0, None)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_decoded_weights_are_the_graphs(name):
    cin, cout, k, stride, group, kind, accel, flags, (fmt, sparse, traversal) = CASES[name]
    shape = (cout, cin // group, k, k)
    w = _levels(kind, shape, 1) if isinstance(kind, int) else _sparse(shape, 2) if kind == "sparse" else rand(
        shape, 7, -0.5, 0.5)
    m = single_op_model("Conv", {"x": [1, cin, 10, 10]}, {"y": None}, {"w": w, "b": rand((cout,), 8)},
                        pads=[k // 2] * 4, strides=[stride, stride], group=group)
    tosa = lower_int(m, [1, cin, 10, 10])[0]
    with tempfile.TemporaryDirectory() as tmp:
        ops = _decoded_weights(vela_raw(tosa, Path(tmp), accel, *flags))
    assert ops
    if group == 1:
        want = _tosa_weights(tosa, (cout, k, k, cin))
    else:  # TOSA depthwise weights are [KH, KW, C, 1]; ours OHW1
        want = _tosa_weights(tosa, (k, k, cin, 1)).transpose(2, 0, 1, 3)
    channel = 0
    for _cmd, got in ops:  # ops split along the OFM depth each decode their own channels
        n = got.shape[0]
        np.testing.assert_array_equal(got, want[channel:channel + n], err_msg=name)
        channel += n
    assert channel == cout
    p = ops[0][0].regs
    assert ("FWD" if p.get("WEIGHT_FORMAT", 0) & 1 else "SWD", p.get("WEIGHT_FORMAT", 0) >> 4 & 1) == (fmt, sparse)
    if traversal:
        assert ("PK" if p.get("KERNEL_STRIDE", 0) >> 2 & 1 else "DF") == traversal


def test_scale_entries_for_32_and_48_bit_accumulators():
    entry32 = (-123456).to_bytes(4, "little", signed=True) + (0x5A5A5A5A).to_bytes(4, "little") + bytes([37, 0])
    entry48 = (-(1 << 40) - 5).to_bytes(6, "little", signed=True) + (0x3FFF).to_bytes(2, "little") + bytes([50, 0])
    b, m, s = wts.decode_scales(entry32 * 2, 2, acc48=False)
    assert list(b) == [-123456] * 2 and list(m) == [0x5A5A5A5A] * 2 and list(s) == [37] * 2
    b, m, s = wts.decode_scales(entry48, 1, acc48=True)
    assert (int(b[0]), int(m[0]), int(s[0])) == (-(1 << 40) - 5, 0x3FFF, 50)
    with pytest.raises(StageError):
        wts.decode_scales(entry32, 2, acc48=False)
