"""The fast weight-stream decoder (chunk walk in Python, values in numpy) gives exactly what the value-at-a-time
decoder it replaced gives (kept as npbtest.swd_reference): on every weight stream Vela wrote for real models on
U55, U65 and U85 (one and several cores), on mlw_codec streams of every slice kind, and on cut-off streams
(the same StageError, or the same values)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.npusim import lower_int, vela_raw
from npbtest.swd_reference import decode_stream as reference_decode

from npubuild.errors import StageError
from npubuild.frontend.normalise import normalise
from npubuild.npusim import weights
from npubuild.npusim.npz import load_raw
from npubuild.npusim.sim import run

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
REAL = {  # model: (input shape, accelerators)
    "resnet8": ([1, 3, 32, 32], ("ethos-u55-128", "ethos-u85-256")),
    "mobilenet_v3_block": ([1, 3, 64, 64], ("ethos-u65-256", "ethos-u85-2048")),
    "unet": ([1, 1, 64, 64], ("ethos-u85-512",)),  # its resizes need U55's lowering options (not the default)
    "mobilenet_v1": ([1, 3, 96, 96], ("ethos-u55-64",)),
    "ds_cnn": ([1, 1, 49, 10], ("ethos-u55-256", "ethos-u85-1024")),
}


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def _decoded_streams(npz: Path, monkeypatch) -> list[bytes]:
    """Every standard-format stream the simulator decodes running the artifact (weights.decode_stream through
    decode_cached, for U55/U65 ops and U85's per-core streams), each checked against the reference there."""
    seen: list[bytes] = []
    fast = weights.decode_stream

    def checked(data: bytes) -> np.ndarray:
        got = fast(data)
        assert _same(got, reference_decode(data)), f"stream {len(seen)} ({len(data)} bytes) differs"
        seen.append(data)
        return got

    monkeypatch.setattr(weights, "decode_stream", checked)
    weights.decode_cached.cache_clear()
    model = load_raw(npz)
    run(model, [np.zeros(p.shape, {1: np.int8, 2: np.int16}[p.elem_size]) for p in model.inputs], keep_ofms=False)
    weights.decode_cached.cache_clear()
    return seen


@pytest.mark.parametrize("name,accel", [(m, a) for m, (_, accels) in REAL.items() for a in accels])
def test_fast_decoder_equals_the_reference_on_vela_streams_of_real_models(name, accel, monkeypatch):
    shape, _ = REAL[name]
    model = normalise(onnx.load(MODELS / f"{name}.onnx"), {"input": shape}, "<test>")
    tosa, _ = lower_int(model, shape)
    with tempfile.TemporaryDirectory() as tmp:
        streams = _decoded_streams(vela_raw(tosa, Path(tmp), accel), monkeypatch)
    assert len(streams) >= 2 and sum(map(len, streams)) > 1000


KINDS = {  # values for mlw_codec, with the slices Vela's encoder makes of them
    "uniform": lambda r, n: r.integers(-255, 256, n),  # no zero runs, uncompressed (9-bit fields)
    "gaussian": lambda r, n: _clipped(r.normal(0, 40, n)),  # no zero runs, unary quotients (the dense walk)
    "laplace": lambda r, n: _clipped(r.laplace(0, 20, n)),  # the same, longer tails (code 2s over chunks)
    "few_levels": lambda r, n: r.choice([-90, -3, 0, 7, 60], n),  # palette, truncated quotients
    "sparse_small": lambda r, n: r.integers(-4, 5, n) * (r.random(n) < 0.15),  # zero runs, truncated/uncompressed
    "sparse_gaussian": lambda r, n: _clipped(r.normal(0, 30, n)) * (r.random(n) < 0.6),  # zero runs, unary
    "sparse_wide": lambda r, n: _clipped(r.normal(0, 80, n)) * (r.random(n) < 0.4),  # zero runs, uncompressed
    "constant": lambda r, n: np.full(n, int(r.integers(-255, 256))),
}


def _clipped(x: np.ndarray) -> np.ndarray:
    return np.clip(x.astype(int), -255, 255)



@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fast_decoder_equals_the_reference_on_every_slice_kind(kind):
    from ethosu import mlw_codec

    rng = np.random.default_rng(sorted(KINDS).index(kind))
    for size in (1, 5, 12, 13, 100, 3000, 40000):
        v = KINDS[kind](rng, size)
        enc = bytes(mlw_codec.encode([int(x) for x in v]))
        got = weights.decode_stream(enc)
        assert _same(got, reference_decode(enc)), (kind, size)
        np.testing.assert_array_equal(got[:size], v)


@pytest.mark.parametrize("kind,dense_walk", [("gaussian", True), ("sparse_gaussian", False)])
def test_each_chunk_walk_is_the_one_tested(kind, dense_walk, monkeypatch):
    """Dense values go through the dense walk (no zero runs), sparse ones through the general one: both are
    what the tests above compare."""
    from ethosu import mlw_codec

    calls = []
    dense = weights._dense_slice
    monkeypatch.setattr(weights, "_dense_slice", lambda *a: calls.append(a[1]) or dense(*a))
    v = KINDS[kind](np.random.default_rng(7), 5000)
    enc = bytes(mlw_codec.encode([int(x) for x in v]))
    assert _same(weights.decode_stream(enc), reference_decode(enc))
    assert (sum(calls) == 5000) if dense_walk else not calls


@pytest.mark.parametrize("kind", ["gaussian", "sparse_gaussian", "few_levels", "uniform"])
def test_cut_off_streams_fail_or_decode_as_the_reference_did(kind):
    from ethosu import mlw_codec

    rng = np.random.default_rng(11)
    enc = bytes(mlw_codec.encode([int(x) for x in KINDS[kind](rng, 600)]))
    for cut in sorted({*range(1, 40), *rng.integers(1, len(enc), 60).tolist(), len(enc) - 1}):
        part = enc[:cut]
        try:
            want = reference_decode(part)
        except StageError:
            with pytest.raises(StageError):
                weights.decode_stream(part)
            continue
        assert _same(weights.decode_stream(part), want), (kind, cut)
