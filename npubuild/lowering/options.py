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
class PlaneRowsLimits:
    """Where a changing-scale whole-plane sum is cheaper as row sums (a (1, W) depthwise of ones) and a
    REDUCE_SUM over H than as one REDUCE_SUM over H*W: the shortest side, the smallest plane (H*W), the
    fewest elements (H*W*C) and the most channels."""

    min_side: int
    min_plane: int
    min_elements: int
    max_channels: int
    max_width: int = 64  # the widest row: Vela's depthwise kernel limit, and 255 * 64 fits the int16 sums


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
    # a whole-plane sum at a new scale (a mean's rounding once) as exact int32 row sums by a (1, W)
    # depthwise of ones, then REDUCE_SUM over H (reduction.int_sum), within these limits: Vela transposes
    # W times less int32 data than for one REDUCE_SUM over H*W, for W*C bytes of ones weights
    plane_rows: PlaneRowsLimits | None = None
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
    # ... and a rank-3 one read by 1-D ops, of 2..planar_1d_input_channels channels, stays NCL (0: NLC)
    planar_1d_input_channels: int = 0
    # a rank-4 int8 graph input of at most 4 channels whose NHWC rows are at least this many bytes is first
    # copied as [N, H, 1, W*C] rows by a MAXIMUM, which Vela reads from DRAM in long bursts into SRAM, so the
    # first conv reads SRAM (input_staging.py; 0: never)
    staged_input_min_row: int = 0
    # a stride-2 int8 conv of at most this many input channels runs at stride 1 on the input's 2x2
    # space-to-depth view (4x the channels, same integers: space_to_depth.py; 0: never)
    space_to_depth_channels: int = 0
    # a conv dilated past 2 as a kernel with zero taps at dilation 2 or 1 (ops_conv.taps_for_dilation), not
    # Vela's split into one conv per dilation phase
    dilation_taps: bool = False
    # a 1-D conv dilated by at least this much as an undilated (k, 1) conv on the phase view [N, L / d, d, C]
    # of its input (ops_conv.phase_view): no zero taps, no RESHAPE between a block's convs and Add (0: never)
    dilation_phase_min: int = 0
    # a layer norm's / softmax's per-row statistics (the rsqrt / reciprocal chain) viewed as one channel row
    # [1, 1, 1, rows] (reduction.stats_as_channels): Vela runs per-row ops on [16, 1] as 16 blocks, on [1, 16] as one
    row_stats_channels: bool = False
    # a layer norm's variance from the int8 squares, K sum(x^2) - s^2, and t = s - K m0 per row (norm_rows; the same
    # integers as K sum(c^2) - t^2 with t = sum(c)): an int8 MUL instead of an int32 one, one REDUCE_SUM fewer
    norm_raw_squares: bool = False
    # a layer norm's gamma / beta depthwise conv on its rows as [1, 1, rows, K] instead of [1, rows, 1, K] (ops_norm)
    norm_affine_one_row: bool = False
    # a transposed conv whose kernel equals its stride (no two taps meet: a U-Net's 2x2 / 2 upsampling) as one
    # 1x1 CONV2D of every phase as channels, then the depth-to-space shuffle (ops_conv.phases_conv: the same
    # integers): Vela 5.2 leaves a TRANSPOSE_CONV2D's per-channel RESCALE unfused, an int32 MUL
    transpose_conv_phases: bool = False
    # an int8 conv whose kernel equals its stride, from this stride on, as a 1x1 conv of the input's patch view
    # (space_to_depth.patch_view: the same integers); Vela runs a stride past 3 as one conv per output (0: never)
    patch_conv_min_stride: int = 0
    # DepthToSpace (DCR) as one channel SLICE per output row phase, stacked by a CONCAT, no TRANSPOSE (ops_resize)
    depth_to_space_rows: bool = False
    # a per-channel PRelu's two branches cut at the zero point with MAXIMUM / MINIMUM of the zero point (U85 runs
    # elementwise ops at 4 elements a cycle, a CLAMP as a 1x1 pool at 2), the same integers as the CLAMPs and
    # RESCALE (ops/unary._int_prelu_branches)
    prelu_elementwise: bool = False
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

    def plane_rows_pays(self, x) -> bool:
        """Whether the exact int32 sum of int8 `x` (NHWC) over H and W is cheaper as row sums first."""
        lim = self.plane_rows
        if lim is None or len(x.shape) != 4 or x.dtype != np.int8 or x.q is None or not x.q.is_per_tensor:
            return False
        _, h, w, c = x.shape
        return (min(h, w) >= max(lim.min_side, 2) and w <= lim.max_width and h * w >= lim.min_plane
                and h * w * c >= lim.min_elements and c <= lim.max_channels)

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
# Every family: the layer norm's and softmax's per-row statistics as one channel row (transformer U55-128
# 229072 -> 208144 cycles and SRAM 16.25 -> 9.25 KiB, U65-256 250116 -> 232232, U85-256 71417 -> 63845 and
# 16.25 -> 8.64 KiB: Vela ran each per-row op on [16, 1] as 16 blocks, 320 U55 cycles; bench/perf_choices.md).
# U55, U65 and U85-128..512: the layer norm's gamma / beta depthwise on [1, 1, rows, K] (with the int8 squares below:
# U55-128 204224 -> 203424, U65-256 229312 -> 224001 and SRAM 20.73 -> 12.50 KiB, U85-256 62847 -> 62008; U85-1024
# 45799 -> 45803, not taken there). U55 and U65: the layer norm's variance from the int8 squares (K <= 128; an int8
# MUL for an int32 one, one REDUCE_SUM of c fewer): U55-128 207344 -> 203424, U65-256 226921 -> 224001; on U85-256
# 61616 -> 62008 and U85-1024 44879 -> 45803 it loses (measured with the other two forms on).
EVERY_FAMILY = {"row_stats_channels": True, "patch_conv_min_stride": 4}
NORM_U55_U65 = {"norm_raw_squares": True, "norm_affine_one_row": True}
FAMILY_OPTIONS: dict[LoweringFamily, LoweringOptions] = {
    # every family: a dilation past 2 as zero kernel taps (TCN d = 4, 8: U55-128 0.1522 -> 0.0911 ms, U65-256
    # 0.0542 -> 0.0322, U85-256 0.0451 -> 0.0262; the TFLite route 0.0775 / 0.0263 / 0.0213, bench/perf_choices.md).
    # A Conv1d dilated by d >= dilation_phase_min on its phase view instead (tcn_imu, with the 1-D values kept
    # rank 4: U55-128 0.0739 -> 0.0614 ms at d >= 4 (same at 2), U65-256 0.0241 -> 0.0231 at d >= 8 (0.0243 at
    # 4: its first conv after each view change pays DRAM weight latency), U85-256 0.0202 -> 0.0173 at d >= 4
    # (0.0181 at 2); U85-1024 / 2048 0.0119 / 0.0167 -> 0.0102 / 0.0116 at d >= 2 (0.0102 / 0.0132 at 4).
    # Every family: a changing-scale plane mean as row sums first wherever the sweep (bench/perf_choices.md) found
    # it faster (int16 row sums, 26 shapes x 4 sizes): MobileNetV3 block U55-128 0.5664 -> 0.5177 ms, U85-256
    # 0.1625 -> 0.1263; it loses on small planes of many channels (3x3x256, 4x4x96) everywhere and under 10x10
    # on U65 and U85-1024; U55 keeps sides under 8 (DS-CNN's 25x5x64 mean: 0.6% faster for +0.58 KiB of flash,
    # its ones weights and scales, over ExecuTorch's off-chip). U55 and U65: a stride-2 conv of a 1-channel input on its space-to-depth view (DS-CNN
    # U55-128 0.1744 -> 0.1596 ms, U65-256 0.0529 -> 0.0503; slower on U85, and for 3-channel images everywhere:
    # the view's TRANSPOSE of a 64x64x3 image costs more than the idle MACs).
    # U55 (decided on U55-128, the example target; U55-32 prefers the portable form for the copies and sums):
    # the in-order copies set the U-Net SRAM peak (214 -> 178 KiB); the depthwise requantise/copy is 10-25%
    # faster on every shape; bilinear 2x has no RESIZE op on U55; the halves trade +0.6-1% cycles for
    # 9-17 KiB of SRAM; REDUCE_SUM beats the pool's per-element steps from a 4x4 window for 16..96
    # channels; the layer-norm forms each save 1280 cycles on the transformer.
    "u55": LoweringOptions(**EVERY_FAMILY, **NORM_U55_U65, concat_order=True, dw_requantize=True, concat_dw_copy=True,
                           depthwise_limits=DepthwiseLimits(max_channels=1 << 30, min_plane=0), bilinear_2x=True,
                           bilinear_channel_split=True, plane_sum=PlaneSumLimits(16, 16, 96),
                           norm_widen_add=True, norm_index_rescale=True, dilation_taps=True,
                           dilation_phase_min=4,
                           plane_rows=PlaneRowsLimits(min_side=8, min_plane=64, min_elements=3072, max_channels=256),
                           space_to_depth_channels=1, transpose_conv_phases=True),
    # U55 and U65: a transposed conv whose kernel is its stride as a 1x1 conv of its phases and a depth-to-space
    # shuffle (a 16x16x16 -> 32x32x8 2x2/2 upsample between convs: U55-128 0.568 -> 0.085 ms, U65-256 0.095 ->
    # 0.044; U85-256 loses, 0.056 -> 0.076: its TRANSPOSE_CONV2D's RESCALE is cheap there).
    # U65: U55's TOSA op set on a wider MAC array and bus: the depthwise form wins only for <= 16 channels
    # on >= 16x16 planes, the upsample halves cost 3-6% there (kept whole), the sum wins from 8x8 x 32 ch;
    # a 3-channel image input kept planar and transposed on the NPU saves 33% on MobileNetV1 96x96 (its
    # first conv read the input from DRAM 3 bytes at a time), 7% on ResNet-8 and 3% on the MobileNetV3 block.
    # The same for a 6-channel 1-D input: TCN 0.0231 -> 0.0225 ms (its first conv read 6 bytes at a time, 4889
    # cycles; U55-128 / U85-256 lose: 0.0614 -> 0.0616, 0.0173 -> 0.0185).
    # No input staging (U85's): digits 0.0027 -> 0.0023 ms and the U-Nets -2%, but 1-channel stems of 8x8 to
    # 64x64 lose up to 50% in isolation (bench/perf_choices.md): it depends on Vela's schedule around the stem.
    "u65": LoweringOptions(**EVERY_FAMILY, **NORM_U55_U65, concat_order=True, dw_requantize=True, concat_dw_copy=True, bilinear_2x=True,
                           plane_sum=PlaneSumLimits(64, 32, 1 << 30), norm_widen_add=True, norm_index_rescale=True,
                           planar_input_channels=4, planar_1d_input_channels=8, dilation_taps=True,
                           dilation_phase_min=8,
                           plane_rows=PlaneRowsLimits(min_side=5, min_plane=100, min_elements=3072, max_channels=256),
                           space_to_depth_channels=1, transpose_conv_phases=True),
    # U85-128/256/512: the order with the MAXIMUM copy saves 3% and 30 KiB on the U-Nets; zero kernel taps
    # and the int32 softmax for short rows are faster on every U85 size; a 3-channel image input with rows of
    # 128 bytes or more is staged into SRAM (every U85 size: MobileNetV1 96x96 U85-256 0.2384 -> 0.1863 ms,
    # the MobileNetV3 block 0.1263 -> 0.1063; 32x32x3 inputs gain on U85-256 only, 1-channel ones lose); the
    # row sums of a plane mean only from 16384 elements: below it they gain 0.2-3.5% (DS-CNN, the KWS and TCN
    # heads) for 0.2-0.7 KiB of DRAM constants, the 32x32x64 MobileNetV3 pool 34% (bench/perf_choices.md).
    "u85": LoweringOptions(**EVERY_FAMILY, norm_affine_one_row=True, concat_order=True, concat_max_copy=True, conv_stride_taps=True, softmax_wide=True,
                           dilation_taps=True, dilation_phase_min=4, plane_rows=PlaneRowsLimits(4, 49, 16384, 256),
                           staged_input_min_row=128, depth_to_space_rows=True, prelu_elementwise=True),
    # U85-128/256/512 also run a DepthToSpace (DCR) as row-phase SLICEs and a CONCAT: 1x1 conv to 32x16x16 ->
    # depth-to-space 2 -> 8x32x32, U85-256 0.0756 -> 0.0452 ms (U55-128 0.0851 -> 0.0987, U65-256 0.0437 -> 0.0494).
    # U85-1024/2048: the skip-first order makes Vela keep the Concat NHWC, which the reader conv reads slower
    # there, and the MAXIMUM copy loses to Vela's own: neither; the taps and the int32 softmax still win.
    "u85wide": LoweringOptions(**EVERY_FAMILY, conv_stride_taps=True, softmax_wide=True, dilation_taps=True, dilation_phase_min=2,
                               plane_rows=PlaneRowsLimits(4, 100, 3072, 256), staged_input_min_row=128,
                               prelu_elementwise=True),
}
