"""Our weight-stream decoder agrees with Vela's own mlw_codec on random and real streams; scale entries decode."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from npbtest.npusim import lower_int, vela_raw
from npbtest.ops import rand, single_op_model

from npubuild.errors import StageError
from npubuild.npusim.cmdstream import decode
from npubuild.npusim.npz import load_raw
from npubuild.npusim.weights import decode_scales, decode_stream


def _mlw():
    from ethosu import mlw_codec

    return mlw_codec


@pytest.mark.parametrize("kind", ["uniform", "sparse", "narrow", "tiny"])
def test_decoder_matches_mlw_codec_on_encoded_values(kind):
    rng = np.random.default_rng({"uniform": 0, "sparse": 1, "narrow": 2, "tiny": 3}[kind])
    for _ in range(8):
        n = int(rng.integers(1, 4000)) if kind != "tiny" else int(rng.integers(1, 20))
        if kind == "uniform":
            v = rng.integers(-255, 256, n)
        elif kind == "sparse":
            v = rng.integers(-4, 5, n) * (rng.random(n) < 0.15)
        else:
            v = np.clip(rng.normal(0, 12, n).astype(int), -255, 255)
        enc = bytes(_mlw().encode([int(x) for x in v]))
        ours = decode_stream(enc)
        theirs = np.asarray(_mlw().decode(bytearray(enc)))
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(ours[:n], v)


def test_decoder_matches_mlw_codec_on_a_compiled_artifact():
    m = single_op_model("Conv", {"x": [1, 16, 8, 8]}, {"y": None},
                        {"w": rand((32, 16, 3, 3), 3), "b": rand((32,), 4)}, pads=[1, 1, 1, 1])
    tosa, _ = lower_int(m, [1, 16, 8, 8])
    with tempfile.TemporaryDirectory() as tmp:
        model = load_raw(vela_raw(tosa, Path(tmp)))
    conv = [c for c in decode(model.commands) if c.kind == "CONV"][0]
    base, length = conv.addr("WEIGHT_BASE"), conv.regs["WEIGHT_LENGTH"]
    assert conv.regs["WEIGHT_REGION"] == model.weight_region
    stream = model.weights[base:base + length]
    ours = decode_stream(stream)
    np.testing.assert_array_equal(ours, np.asarray(_mlw().decode(bytearray(stream))))
    assert len(ours) >= 32 * 16 * 9
    bias, mult, shift = decode_scales(model.weights[conv.addr("SCALE_BASE"):], 32)
    assert (mult > 0).all() and (shift > 0).all() and np.abs(bias).max() > 0


def test_truncated_stream_is_an_error():
    enc = bytes(_mlw().encode(list(range(-100, 100))))
    with pytest.raises(StageError):
        decode_stream(enc[:5])
