"""frontend/weight_channels.py: onnxruntime's per-channel weight parameters and int values, the same bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from npbtest.quantiser_models import conv_concat_gemm
from onnx import numpy_helper
from onnxruntime import quantization as ortq
from onnxruntime.quantization import quant_utils

from npubuild.frontend import weight_channels
from npubuild.frontend.ort_quantiser import linear_quantiser
from npubuild.frontend.quantize import ArrayReader
from npubuild.frontend.weight_channels import (
    channel_params,
    fast_quantize_onnx_initializer,
    quantize_channels,
)

T = onnx.TensorProto
TYPES = (T.INT8, T.UINT8, T.INT16, T.UINT16)


def _onnxruntimes_params(data: np.ndarray, axis: int, quant_type: int, reduce_range: bool,
                         min_real_range: float | None) -> tuple[np.ndarray, np.ndarray]:
    """QDQQuantizer._calc_initializer_quant_params's per-channel loop, as it is written there."""
    zps, scales = [], []
    for i in range(data.shape[axis]):
        zp, scale = quant_utils.compute_data_quant_params(data.take(i, axis).ravel(), quant_type, True,
                                                          reduce_range=reduce_range, min_real_range=min_real_range)
        zps.append(zp)
        scales.append(scale)
    return np.asarray(zps), np.asarray(scales)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _edge_tensors(rng: np.random.Generator) -> list[np.ndarray]:
    """Weights with the channels where a branch can go either way: all zero (and -0.0), constant, one value,
    ranges below float32's smallest normal scale and around it, one-signed, huge, and ordinary."""
    tiny = np.finfo(np.float32).tiny
    tensors = []
    for scale in (1.0, 1e-3, 1e-30, 127 * tiny, 1e-44, 1e30, 1e38):
        w = (np.clip(rng.standard_normal((8, 3, 3, 3)), -3, 3) * scale).astype(np.float32)
        w[0] = 0.0
        w[1] = -0.0
        w[2] = np.float32(scale)  # constant
        w[3] = np.abs(w[3])  # one-signed
        w[4] = -np.abs(w[4])
        w[5, 1:] = 0.0  # one value
        tensors.append(w)
    edge = np.array([127, 126.9999, 127.0001, 254, 255, 32767, 65534], dtype=np.float64) * tiny
    tensors.append(np.stack([np.full((2, 5), v) for v in edge]).astype(np.float32))  # scales at float32's tiny
    tensors.append(rng.standard_normal((1, 17)).astype(np.float32))
    tensors.append(rng.standard_normal((5, 1)).astype(np.float32))
    tensors.append(rng.standard_normal((6,)).astype(np.float32))
    return tensors


@pytest.mark.parametrize("quant_type", TYPES)
def test_channel_params_are_onnxruntimes(quant_type: int):
    """Every channel's zero point and scale, dtype and shape, as onnxruntime's loop makes them, on every axis,
    with and without reduce_range and a min_real_range (none, zero, one that binds)."""
    rng = np.random.default_rng(quant_type)
    checked = 0
    for data in _edge_tensors(rng):
        for axis in range(data.ndim):
            for reduce_range in (False, True):
                for min_real_range in (None, 0.0, 1e-4, 1e-40):
                    got = channel_params(data, axis, quant_type, reduce_range, min_real_range)
                    want = _onnxruntimes_params(data, axis, quant_type, reduce_range, min_real_range)
                    assert got is not None
                    assert _same(got[0], want[0]) and _same(got[1], want[1]), (data.shape, axis, reduce_range)
                    checked += 1
    assert checked > 200


def test_channel_params_fuzzed():
    """Random shapes, axes, scales and offsets against onnxruntime's loop."""
    rng = np.random.default_rng(33)
    for _ in range(300):
        shape = tuple(int(d) for d in rng.integers(1, 6, rng.integers(1, 5)))
        data = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-40, 30) + rng.uniform(-1, 1) * 10.0 **
                rng.uniform(-40, 30)).astype(np.float32)
        axis = int(rng.integers(0, data.ndim))
        quant_type = TYPES[rng.integers(0, len(TYPES))]
        reduce_range = bool(rng.integers(0, 2))
        min_real_range = (None, 1e-6, 1e-38)[rng.integers(0, 3)]
        got = channel_params(data, axis, quant_type, reduce_range, min_real_range)
        want = _onnxruntimes_params(data, axis, quant_type, reduce_range, min_real_range)
        assert _same(got[0], want[0]) and _same(got[1], want[1]), (shape, axis, quant_type)


def test_channel_params_leave_the_rest_to_onnxruntime():
    """Not the plain case: no result, so onnxruntime's own code runs."""
    data = np.ones((2, 3), dtype=np.float32)
    assert channel_params(data.astype(np.float16), 0, T.INT8, False, None) is None
    assert channel_params(data.astype(np.float64), 0, T.INT8, False, None) is None
    assert channel_params(data, 0, T.INT4, False, None) is None
    assert channel_params(data, 0, T.FLOAT8E4M3FN, False, None) is None
    assert channel_params(data, 2, T.INT8, False, None) is None
    assert channel_params(np.zeros((2, 0), dtype=np.float32), 0, T.INT8, False, None) is None
    assert channel_params(data, 0, T.INT8, False, float("inf")) is None
    for bad in (np.nan, np.inf, -np.inf):
        other = data.copy()
        other[1, 2] = bad
        assert channel_params(other, 0, T.INT8, False, None) is None


@pytest.mark.filterwarnings("ignore:overflow encountered in divide")  # 1e38 over a third of its scale, in both
@pytest.mark.parametrize("quant_type", TYPES)
def test_quantised_channels_are_onnxruntimes(quant_type: int):
    """The int initializer, byte for byte, as onnxruntime's quantize_onnx_initializer makes it: its own
    parameters, values exactly half a step apart (round half to even), and scales small enough to clip."""
    rng = np.random.default_rng(100 + quant_type)
    own = quant_utils.quantize_onnx_initializer
    fast = fast_quantize_onnx_initializer(own)
    for data in _edge_tensors(rng):
        for axis in range(data.ndim):
            zp, scale = _onnxruntimes_params(data, axis, quant_type, False, None)
            halves = (np.arange(data.size, dtype=np.float32).reshape(data.shape) - data.size / 2) * 0.5
            for values, s in ((data, scale), (halves, np.ones_like(scale)), (data, scale / 3), (halves, scale)):
                weight = numpy_helper.from_array(values, "w")
                for name in (None, "w_q"):
                    want = own(weight, quant_type, zp, s, axis, name)
                    got = fast(weight, quant_type, zp, s, axis, name)
                    assert got.SerializeToString() == want.SerializeToString(), (data.shape, axis)
                assert quantize_channels(values, quant_type, zp, s, axis) is not None


def test_quantised_channels_leave_the_rest_to_onnxruntime():
    data = np.ones((2, 3), dtype=np.float32)
    zp, scale = np.zeros(2, np.int8), np.ones(2, np.float32)
    assert quantize_channels(data, T.INT8, zp, scale.astype(np.float64), 0) is None
    assert quantize_channels(data, T.INT8, zp.astype(np.int16), scale, 0) is None
    assert quantize_channels(data, T.INT8, zp, np.zeros(2, np.float32), 0) is None
    assert quantize_channels(data, T.INT8, zp[:1], scale[:1], 0) is None
    assert quantize_channels(data, T.INT8, zp, scale, -2) is None
    other = data.copy()
    other[0, 0] = np.nan
    assert quantize_channels(other, T.INT8, zp, scale, 0) is None


def _quantise(src: Path, out: Path, x: np.ndarray, weight_type: ortq.QuantType) -> bytes:
    ortq.quantize_static(str(src), str(out), ArrayReader({"x": x}), quant_format=ortq.QuantFormat.QDQ,
                         per_channel=True, weight_type=weight_type,
                         activation_type=weight_type if weight_type == ortq.QuantType.QUInt8 else ortq.QuantType.QInt8,
                         extra_options={"ActivationSymmetric": False, "WeightSymmetric": True,
                                        "ForceQuantizeNoInputCheck": True})
    return out.read_bytes()


@pytest.mark.parametrize("weight_type", [ortq.QuantType.QInt8, ortq.QuantType.QUInt8, ortq.QuantType.QInt16])
def test_quantiser_writes_onnxruntimes_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             weight_type: ortq.QuantType):
    """A whole QDQ model, byte for byte, with onnxruntime's per-channel loops and with these: weights with a
    zero channel and a channel too small for a normal scale, and the fast path taken for every weight."""
    rng = np.random.default_rng(7)
    model = conv_concat_gemm(rng)
    for tensor in model.graph.initializer:
        w = numpy_helper.to_array(tensor).copy()
        if w.ndim >= 2:
            w[0] = 0.0
            w[-1] = w[-1] * np.float32(1e-40)
            tensor.CopyFrom(numpy_helper.from_array(w, tensor.name))
    src = tmp_path / "float.onnx"
    onnx.save(model, src)
    x = rng.uniform(-1, 1, (4, 1, 3, 16, 16)).astype(np.float32)
    own = _quantise(src, tmp_path / "own.onnx", x, weight_type)
    taken = []
    params = weight_channels.channel_params
    monkeypatch.setattr(weight_channels, "channel_params", lambda *a: taken.append(a) or params(*a))
    with linear_quantiser():
        fast = _quantise(src, tmp_path / "fast.onnx", x, weight_type)
    assert own == fast
    assert len(taken) == sum(numpy_helper.to_array(t).ndim >= 2 for t in model.graph.initializer)


def test_bias_scale_adjustment_is_onnxruntimes():
    """_adjust_weight_scale_for_int32_bias's per-channel loop: the same flag, the same scales in the same array,
    on channels that need raising (large biases, tiny weight scales), channels at exactly the limit, zero
    scales and biases, and the cases left to onnxruntime (float16 scales, a bias of another length)."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    own = QDQQuantizer._adjust_weight_scale_for_int32_bias
    fast = weight_channels.fast_bias_scale_adjust(own)
    rng = np.random.default_rng(21)
    raised = 0
    for t in range(300):
        n = int(rng.integers(1, 40))
        bias = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 6)).astype(np.float32)
        scale = (np.abs(rng.standard_normal(n)) * 10.0 ** rng.uniform(-12, 0)).astype(np.float32)
        bias[rng.random(n) < 0.1] = 0.0
        scale[rng.random(n) < 0.05] = 0.0
        input_scale = np.array(10.0 ** rng.uniform(-6, 0), dtype=np.float32)
        if t % 10 == 0:  # input x weight scale exactly at the bias's smallest valid scale
            qrange = np.float64(2**31 - 1) - np.float64(-(2**31) + 1)
            scale = ((1.0001 * (2.0 * np.abs(bias)) / qrange) / np.float64(input_scale.item())).astype(np.float32)
        if t % 25 == 0:
            scale = scale.astype(np.float16)
        if t % 30 == 0:
            bias = np.concatenate([bias, bias])
        tp = numpy_helper.from_array(bias, "b")
        a, b = scale.copy(), scale.copy()
        want = own(None, input_scale, a, "w", tp, True)
        got = fast(None, input_scale, b, "w", tp, True)
        assert want[0] == got[0] and _same(want[1], got[1]) and got[1] is b and _same(a, b), t
        raised += want[0]
    assert 50 < raised < 300
