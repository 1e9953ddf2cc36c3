"""A per-channel int8 RESCALE runs as a 1x1 POOL AVERAGE whose output stage reads a scale stream (U55/U65).

Vela 5.2 (regor) lowers a TOSA RESCALE with one multiplier per channel between int8 tensors to a 1x1 AVERAGE
pool in per-channel scale mode (OFM_PRECISION bit 8 clear) with a 10-byte bias/multiplier/shift entry per
channel, as a convolution has. npu-sim applied the global OFM_SCALE to every pool, so such a rescale came out
wrong: a wake-word head's mean over time followed by a per-channel Mul ("NPU op #6 POOL AVERAGE (ofm
[1, 1, 64]) differs from TOSA RESCALE -> layer-25 [1, 64]") and yolov8n's box decode (the stride per anchor,
a RESCALE over 2100 channels: 14420/184800 output elements). The command stream was right; npu-sim's model
of the command was not.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from npbtest.npusim import assert_bitexact, compile_and_check, mean_then_channel_mul, vela_raw
from npbtest.tosa_graphs import Graph

from npubuild.npusim.cmdstream import decode
from npubuild.npusim.npz import load_raw

ACCELERATORS = ["ethos-u55-128", "ethos-u65-256", "ethos-u65-512", "ethos-u85-256"]


def _channel_rescale(rows: int, channels: int) -> Graph:
    """int8 [1, rows, channels] -> RESCALE with a multiplier and shift per channel and zero points -> int8."""
    rng = np.random.default_rng(channels)
    g = Graph()
    x = g.input([1, rows, channels], np.int8)
    mult = rng.integers(1 << 30, (1 << 31) - 1, channels).tolist()
    shift = rng.integers(30, 34, channels).tolist()
    g.rescale(x, [1, rows, channels], np.int8, np.int8, mult, shift, in_zp=-7, out_zp=5, output=True)
    return g


def _per_channel_pools(npz: Path) -> list:
    return [c for c in decode(load_raw(npz).commands, "x")
            if c.kind == "POOL" and not (c.regs.get("OFM_PRECISION", 0) >> 8) & 1]


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_a_per_channel_rescale_is_bit_exact(accelerator):
    g = _channel_rescale(4, 96)
    tosa = g.serialize()
    with tempfile.TemporaryDirectory() as tmp:
        npz = vela_raw(tosa, Path(tmp), accelerator)
        if not accelerator.startswith("ethos-u85"):  # what the test is about: a pool reading a scale stream
            assert _per_channel_pools(npz), "Vela no longer runs the per-channel RESCALE as a pool"
        assert_bitexact(tosa, g.io, npz, seeds=(0, 1, 2, 3))


@pytest.mark.parametrize("accelerator", ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256"])
def test_a_mean_over_time_then_a_channel_mul_is_bit_exact(accelerator):
    compile_and_check(mean_then_channel_mul(), [1, 16, 64], accelerator)
