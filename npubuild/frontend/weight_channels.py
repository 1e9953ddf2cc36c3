"""onnxruntime's per-channel weight quantisation, every channel at once, to the same values bit for bit.

onnxruntime's QDQQuantizer computes a per-channel weight's scale and zero point, and then its int values,
channel by channel in Python (`compute_data_quant_params` and `quantize_nparray` on `take(i, axis)`): about
80 us a channel, 17 800 channels on ppocrv4_rec (issue 33). Every step of both is elementwise IEEE
arithmetic (a channel's min and max, float32 min/max/abs/add, a float64 subtraction and division, one
float32 rounding; then float32 division, round-half-even, add, clip, cast) except three Python branches;
the same steps on whole arrays give each channel the same bits, and the branches become `np.where` where
they can go either way:

- the per-channel path is always symmetric (no overrides: onnxruntime makes every per-channel weight
  symmetric), so the sign of a zero min or max (the one thing a min/max's order can change) is lost in the
  absolute values, and the zero point is the data-free round((qmin + qmax) / 2);
- `max(rmax, rmin + min_real_range)` is np.maximum where nothing is NaN;
- a scale below float32's smallest normal becomes 1.0 with zero point 0, channel by channel.

Only the plain case is taken: float32 weights with every value finite, an 8- or 16-bit integer type, no
block size, no override of any kind on the tensor, a finite min_real_range; anything else goes to
onnxruntime's own code. tests/frontend/test_weight_channels.py compares both functions with onnxruntime's on
fuzzed tensors; bench/weight_channels_check.py on every weight of the real models.

The same holds for the per-channel loop of _adjust_weight_scale_for_int32_bias (a weight channel's scale
raised where input scale x weight scale is too small for its int32 bias), run for every bias of every
candidate: its float32 and float64 steps on whole arrays, its one branch a mask.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import quant_utils
from onnxruntime.quantization.base_quantizer import QuantizationParams
from onnxruntime.quantization.qdq_quantizer import QDQQuantTensorType

TensorProto = onnx.TensorProto
# the integer types taken here: 4-bit types (ml_dtypes arrays) and float 8 go to onnxruntime's code
FAST_TYPES = frozenset({TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16})


def channel_params(data: np.ndarray, axis: int, quant_type: int, reduce_range: bool,
                   min_real_range: float | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(zero points, scales) as onnxruntime's per-channel loop of compute_data_quant_params(channel, quant_type,
    symmetric=True, reduce_range, min_real_range) stacks them by np.asarray; None where not the plain case."""
    if (data.dtype != np.float32 or quant_type not in FAST_TYPES or not 0 <= axis < data.ndim or data.size == 0
            or (min_real_range is not None and not math.isfinite(min_real_range)) or not np.isfinite(data).all()):
        return None
    qmin, qmax = quant_utils.get_qmin_qmax_for_qType(quant_type, reduce_range, symmetric=True)
    channels = np.moveaxis(data, axis, 0).reshape(data.shape[axis], -1)
    zero = np.array(0, dtype=data.dtype)
    rmin = np.minimum(channels.min(axis=1), zero)
    rmax = np.maximum(channels.max(axis=1), zero)
    if min_real_range is not None:
        rmax = np.maximum(rmax, rmin + np.asarray(min_real_range, dtype=data.dtype))
    absmax = np.maximum(np.abs(rmin), np.abs(rmax))
    dr = np.array(absmax, dtype=np.float64) - np.array(-absmax, dtype=np.float64)
    dq = np.array(qmax, dtype=np.float64) - np.array(qmin, dtype=np.float64)
    scale = dr / dq
    small = scale < np.finfo(data.dtype).tiny
    centre = np.array(np.round((qmin + qmax) / np.array(2.0, dtype=np.float64)), dtype=qmin.dtype)
    zero_point = np.where(small, np.array(0, dtype=qmin.dtype), centre).astype(qmin.dtype)
    return zero_point, np.where(small, np.array(1.0, dtype=data.dtype), scale.astype(data.dtype))


def quantize_channels(data: np.ndarray, quant_type: int, zero_point: Any, scale: Any, axis: int) -> np.ndarray | None:
    """The int values onnxruntime's per-channel loop of quantize_nparray(quant_type, channel, scale[i],
    zero_point[i]) concatenates; None where not the plain case (float32 data and scales, finite, positive
    scales, zero points of the type's own dtype)."""
    if quant_type not in FAST_TYPES or data.dtype != np.float32 or not 0 <= axis < data.ndim:
        return None
    dtype = quant_utils.ONNX_TYPE_TO_NP_TYPE[quant_type]
    n = data.shape[axis]
    if not (isinstance(scale, np.ndarray) and isinstance(zero_point, np.ndarray) and scale.dtype == np.float32
            and zero_point.dtype == dtype and scale.shape == (n,) and zero_point.shape == (n,)):
        return None
    if not (np.isfinite(scale).all() and (scale > 0).all() and np.isfinite(data).all()):
        return None
    shape = [1] * data.ndim
    shape[axis] = n
    qmin, qmax = quant_utils.get_qmin_qmax_for_qType(quant_type, reduce_range=False, symmetric=False)
    values = (data / scale.reshape(shape)).round() + zero_point.reshape(shape)
    np.clip(values, qmin, qmax, out=values)
    return values.astype(dtype)


def fast_quantize_onnx_initializer(original: Callable[..., onnx.TensorProto]) -> Callable[..., onnx.TensorProto]:
    """onnxruntime's quantize_onnx_initializer, a per-channel int8/16 float32 weight quantised in one pass."""

    def quantize_onnx_initializer(weight: onnx.TensorProto, quant_type: int, zero_point: Any, scale: Any,
                                  axis: int | None = None, quant_weight_name: str | None = None,
                                  block_size: int = 0) -> onnx.TensorProto:
        if axis is not None and block_size == 0 and quant_type in FAST_TYPES:
            data = quant_utils.tensor_proto_to_array(weight)
            values = quantize_channels(data, quant_type, zero_point, scale, axis)
            if values is not None:
                name = quant_weight_name if quant_weight_name else f"{weight.name}{quant_utils.TENSOR_NAME_QUANT_SUFFIX}"
                return onnx.numpy_helper.from_array(values.reshape(weight.dims), name)
        return original(weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size)

    return quantize_onnx_initializer


def _plain_params(q: Any, name: str, info: Any, initializer: onnx.TensorProto | None) -> QuantizationParams | None:
    """One tensor's QuantizationParams as onnxruntime's _calc_initializer_quant_params makes them for a
    per-channel initializer without overrides, or None where it is not that case."""
    if initializer is None or info.axis is None or name in q.tensor_quant_overrides \
            or q.tensor_quant_overrides.overrides_scale_zp(name):
        return None
    data = quant_utils.tensor_proto_to_array(initializer)
    valid, axis = quant_utils.normalize_axis(info.axis, data.ndim)
    quant_type = q.weight_qType if info.tensor_type is QDQQuantTensorType.WEIGHT else q.activation_qType
    params = channel_params(data, axis, quant_type, q.reduce_range, q.min_real_range) if valid else None
    if params is None:
        return None
    return QuantizationParams(zero_point=params[0], scale=params[1], quant_type=quant_type, axis=axis)


def fast_initializer_quant_params(original: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
    """QDQQuantizer._calc_initializer_quant_params with the plain per-channel tensors' parameters made here and
    the rest by onnxruntime's method (given only those tensors), in the order onnxruntime's gives them."""

    def _calc_initializer_quant_params(self: Any) -> dict[str, Any]:
        if getattr(self, "block_size", 0) > 0:
            return original(self)
        initializers: dict[str, onnx.TensorProto] = {}
        for tensor in self.model.initializer():  # the first of each name, as find_by_name
            initializers.setdefault(tensor.name, tensor)
        made = {}
        for name, info in self.tensors_to_quantize.items():
            params = _plain_params(self, name, info, initializers.get(name))
            if params is not None:
                made[name] = params
        every = self.tensors_to_quantize
        self.tensors_to_quantize = {n: i for n, i in every.items() if n not in made}
        try:
            rest = original(self)
        finally:
            self.tensors_to_quantize = every
        return {n: made[n] if n in made else rest[n] for n in every if n in made or n in rest}

    return _calc_initializer_quant_params


def adjusted_channel_scales(input_scale: np.ndarray, weight_scale: np.ndarray, bias: np.ndarray,
                            ) -> tuple[np.ndarray, np.ndarray] | None:
    """The channels whose scale onnxruntime's per-channel loop of _adjust_weight_scale_for_int32_bias raises (a
    bool mask) and their ratios, the new scales written into `weight_scale` as it writes them; None where not
    the plain case (float32 scales and bias, one bias value per channel, one input scale)."""
    n = weight_scale.shape[0]
    if weight_scale.dtype != np.float32 or bias.dtype != np.float32 or bias.shape != (n,) or input_scale.size != 1:
        return None
    int32_info = np.iinfo(np.int32)
    qrange = np.array(int32_info.max, dtype=np.float64) - np.array(int32_info.min + 1, dtype=np.float64)
    smallest = 1.0001 * (2.0 * np.abs(bias)) / qrange  # float32 until the division, as onnxruntime's scalars
    weight_fp64 = weight_scale.astype(np.float64)
    candidate = np.array(input_scale.item(), dtype=np.float64) * weight_fp64
    adjust = (candidate < smallest) & (candidate > 0.0)
    ratio = smallest[adjust] / candidate[adjust]
    if adjust.any():
        weight_scale[adjust] = (weight_fp64[adjust] * ratio).astype(weight_scale.dtype)
    return adjust, ratio


def fast_bias_scale_adjust(original: Callable[..., tuple[bool, np.ndarray | None]]) -> Callable[..., Any]:
    """QDQQuantizer._adjust_weight_scale_for_int32_bias, a per-channel weight's channels all at once (its log
    line for each raised channel kept)."""

    def _adjust_weight_scale_for_int32_bias(self: Any, input_scale: np.ndarray, weight_scale: np.ndarray,
                                            weight_name: str, bias_tp: onnx.TensorProto,
                                            is_per_channel: bool) -> tuple[bool, np.ndarray | None]:
        if is_per_channel and weight_scale.size and len(weight_scale.shape) == 1:
            bias = quant_utils.tensor_proto_to_array(bias_tp)
            adjusted = adjusted_channel_scales(input_scale, weight_scale, bias)
            if adjusted is not None:
                adjust, ratios = adjusted
                for i, ratio in zip(np.flatnonzero(adjust), ratios, strict=True):
                    logging.info(f"Increased scale[{i}] for weight `{weight_name}` by ratio {ratio} "
                                 f"to ensure bias input `{bias_tp.name}` has a valid scale.")
                return bool(adjust.any()), weight_scale
        return original(self, input_scale, weight_scale, weight_name, bias_tp, is_per_channel)

    return _adjust_weight_scale_for_int32_bias
