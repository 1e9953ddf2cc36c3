"""Which of two equivalent TOSA forms a lowering emits, per Ethos-U lowering family: one typed field a choice.

Every field is an exact rewrite (same integers) that Vela 5.2 runs faster, or in less SRAM, on some
families than the portable form; the portable lowering (`PORTABLE`, what model.tosa and the TOSA check
use) takes none. FAMILY_OPTIONS holds what each family takes, with one line of reason per choice; the
measurements behind them (Vela cycles, SRAM, off-chip per example and shape sweep) are in
bench/family_choices.md and are re-run by bench/family_choices.py. The cost predicates (which shapes a
form pays on) sit beside the options they belong to. Tests and benchmarks pass options, never flip globals.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from npubuild.config.accelerator import LoweringFamily


@dataclass(frozen=True)
class DepthwiseLimits:
    """Where a 1x1 depthwise of ones (requantise or copy) beats a RESCALE / Vela's MemoryCopy: channels at
    most, H*W at least."""

    max_channels: int = 16
    min_plane: int = 256


@dataclass(frozen=True)
class PlaneSumLimits:
    """Where a same-scale whole-plane mean is cheaper as REDUCE_SUM than as AVG_POOL2D: the smallest window
    (H*W) and the channel range."""

    min_count: int
    min_channels: int
    max_channels: int


@dataclass(frozen=True)
class LoweringOptions:
    # Concat inputs Vela must copy are written first (concat_order.py): the SRAM peak of its in-order copies
    concat_order: bool = False
    # an int8 requantise as a 1x1 depthwise conv instead of a RESCALE (emit.requantize), within depthwise_limits
    dw_requantize: bool = False
    # a Concat input Vela copies anyway becomes a depthwise copy at the output's scale (ops_data)
    concat_dw_copy: bool = False
    # ... or an elementwise MAXIMUM of the input with itself, no constant (concat_copy)
    concat_max_copy: bool = False
    depthwise_limits: DepthwiseLimits = DepthwiseLimits()
    # half-pixel bilinear 2x as replication + depthwise blur (required where RESIZE is nearest-only)
    bilinear_2x: bool = False
    # that upsample in two channel halves, so one half's replicated intermediate is live (channel_parts) ...
    bilinear_channel_split: bool = False
    split_min_bytes: int = 32 * 1024  # ... from this replicated size on
    shared_row_pad: bool = True  # ... the halves' row pad done once where its body is a depthwise copy
    # a whole-plane mean at the same scale as REDUCE_SUM instead of AVG_POOL2D (ops_pool), within these limits
    plane_sum: PlaneSumLimits | None = None
    # layer norm: seed widened by one ADD next to an int32 operand; table index as one RESCALE (norm_rows)
    norm_widen_add: bool = False
    norm_index_rescale: bool = False
    # a strided conv that never reaches the last input rows/cols gets zero kernel taps, not a SLICE (ops_conv)
    conv_stride_taps: bool = False
    # softmax's exp in int32 for rows up to softmax_wide_row long and softmax_wide_max elements (softmax_int)
    softmax_wide: bool = False
    softmax_wide_row: int = 32
    softmax_wide_max: int = 512
    # a rank-4 graph input of 2..planar_input_channels channels stays NCHW (planes) and is transposed on the
    # NPU (context.placeholder): Vela then reads it from DRAM in long bursts, not C bytes at a time (0: NHWC)
    planar_input_channels: int = 0
    # a conv dilated past 2 as a kernel with zero taps at dilation 2 or 1 (ops_conv.taps_for_dilation), not
    # Vela's split into one conv per dilation phase
    dilation_taps: bool = False
    # fold INT bias Adds behind a Q/DQ pair into the conv bias too (epilogue: exact per op to 1 LSB but drifts
    # from the QDQ reference, transformer TOSA SNR 32.8 -> 27.6 dB; off everywhere)
    int_bias_add: bool = False

    def depthwise_pays(self, x, out_q) -> bool:
        """Whether this int8 -> int8 requantisation (or copy) of `x` is cheaper as a 1x1 depthwise conv."""
        assert x.q is not None
        if len(x.shape) != 4 or x.dtype != np.int8 or np.dtype(out_q.dtype) != np.int8:
            return False
        _, h, w, c = x.shape
        lim = self.depthwise_limits
        return x.q.is_per_tensor and out_q.is_per_tensor and c <= lim.max_channels and h * w >= lim.min_plane

    def plane_sum_pays(self, x) -> bool:
        """Whether a whole-plane mean of int8 `x` at its own scale is cheaper as REDUCE_SUM (and bit-identical
        to the pool: 1/n exact, n a power of two, or no sum on a rounding tie, n odd; see ops_pool._raw_mean)."""
        lim = self.plane_sum
        if lim is None:
            return False
        count = x.shape[1] * x.shape[2]
        exact = count % 2 == 1 or count & (count - 1) == 0
        return x.dtype == np.int8 and exact and count >= lim.min_count and \
            lim.min_channels <= x.shape[3] <= lim.max_channels

    def exact_only(self) -> LoweringOptions:
        """These options without the forms that round differently from the portable lowering (the int32
        softmax, the bias-Add fold): every form left gives the portable lowering's integers for every input."""
        return replace(self, softmax_wide=False, int_bias_add=False)

    @property
    def same_integers(self) -> bool:
        """Whether every form these options take is an exact rewrite: the lower stage then checks the family's
        graph bit for bit against model.tosa (ethosu/families.same_as_whole)."""
        return self == self.exact_only()

    def softmax_row_is_wide(self, shape: tuple[int, ...]) -> bool:
        return self.softmax_wide and shape[-1] <= self.softmax_wide_row and int(np.prod(shape)) <= self.softmax_wide_max

    @staticmethod
    def for_family(family: LoweringFamily | None) -> LoweringOptions:
        """The options a family's lowering takes (None: the portable lowering)."""
        return PORTABLE if family is None else FAMILY_OPTIONS[family]


PORTABLE = LoweringOptions()
FAMILY_OPTIONS: dict[LoweringFamily, LoweringOptions] = {
    # every family: a dilation past 2 as zero kernel taps (TCN d = 4, 8: U55-128 0.1522 -> 0.0911 ms, U65-256
    # 0.0542 -> 0.0322, U85-256 0.0451 -> 0.0262; the TFLite route 0.0775 / 0.0263 / 0.0213, bench/perf_choices.md).
    # U55 (decided on U55-128, the example target; U55-32 prefers the portable form for the copies and sums):
    # the in-order copies set the U-Net SRAM peak (214 -> 178 KiB); the depthwise requantise/copy is 10-25%
    # faster on every shape; bilinear 2x has no RESIZE op on U55; the halves trade +0.6-1% cycles for
    # 9-17 KiB of SRAM; REDUCE_SUM beats the pool's per-element steps from a 4x4 window for 16..96
    # channels; the layer-norm forms each save 1280 cycles on the transformer.
    "u55": LoweringOptions(concat_order=True, dw_requantize=True, concat_dw_copy=True,
                           depthwise_limits=DepthwiseLimits(max_channels=1 << 30, min_plane=0), bilinear_2x=True,
                           bilinear_channel_split=True, plane_sum=PlaneSumLimits(16, 16, 96),
                           norm_widen_add=True, norm_index_rescale=True, dilation_taps=True),
    # U65: U55's TOSA op set on a wider MAC array and bus: the depthwise form wins only for <= 16 channels
    # on >= 16x16 planes, the upsample halves cost 3-6% there (kept whole), the sum wins from 8x8 x 32 ch;
    # a 3-channel image input kept planar and transposed on the NPU saves 33% on MobileNetV1 96x96 (its
    # first conv read the input from DRAM 3 bytes at a time), 7% on ResNet-8 and 3% on the MobileNetV3 block.
    "u65": LoweringOptions(concat_order=True, dw_requantize=True, concat_dw_copy=True, bilinear_2x=True,
                           plane_sum=PlaneSumLimits(64, 32, 1 << 30), norm_widen_add=True, norm_index_rescale=True,
                           planar_input_channels=4, dilation_taps=True),
    # U85-128/256/512: the order with the MAXIMUM copy saves 3% and 30 KiB on the U-Nets; zero kernel taps
    # and the int32 softmax for short rows are faster on every U85 size.
    "u85": LoweringOptions(concat_order=True, concat_max_copy=True, conv_stride_taps=True, softmax_wide=True,
                           dilation_taps=True),
    # U85-1024/2048: the skip-first order makes Vela keep the Concat NHWC, which the reader conv reads slower
    # there, and the MAXIMUM copy loses to Vela's own: neither; the taps and the int32 softmax still win.
    "u85wide": LoweringOptions(conv_stride_taps=True, softmax_wide=True, dilation_taps=True),
}
