"""Which of two equivalent TOSA forms a lowering emits, per Ethos-U lowering family: one typed field a choice.

Every field is an exact rewrite (same integers) that Vela 5.2 runs faster, or in less SRAM, on some
families than the portable form; the portable lowering (`PORTABLE`, what model.tosa and the TOSA check
use) takes none. FAMILY_OPTIONS holds what each family takes, with one line of reason per family; the
measurements behind them (Vela cycles, SRAM, off-chip per example and shape sweep) are in
bench/family_choices.md and are re-run by bench/family_choices.py. The cost predicates (which shapes a
form pays on) sit beside the options they belong to. Tests and benchmarks pass options, never flip globals.
Off is one value per kind of field: False for a form, None for a threshold or limits (never 0), the
portable member of a choice of several (ConcatCopy.VELA).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

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


class ConcatCopy(Enum):
    """How a Concat input Vela must copy anyway is copied: by Vela (its MemoryCopy), as a 1x1 depthwise of ones
    at the output's scale within `depthwise_limits` (ops/data.py), or as an elementwise MAXIMUM of the input with
    itself, no constant (fusion/concat_copy.py)."""

    VELA = "vela"
    DEPTHWISE = "depthwise"
    MAXIMUM = "maximum"


@dataclass(frozen=True)
class LoweringOptions:
    # Concat inputs Vela must copy are written first (concat_order.py): the SRAM peak of its in-order copies
    concat_order: bool = False
    # an int8 requantise as a 1x1 depthwise conv instead of a RESCALE (emit.requantize), within depthwise_limits
    dw_requantize: bool = False
    concat_copy: ConcatCopy = ConcatCopy.VELA
    depthwise_limits: DepthwiseLimits = DepthwiseLimits()
    # half-pixel bilinear 2x as replication + depthwise blur (required where RESIZE is nearest-only)
    bilinear_2x: bool = False
    # that upsample in two channel halves, so one half's replicated intermediate is live (channel_parts) ...
    bilinear_channel_split: bool = False
    split_min_bytes: int = 32 * 1024  # ... from this replicated size on
    shared_row_pad: bool = True  # ... the halves' row pad done once where its body is a depthwise copy
    # the bilinear 2x's int8 pixel replication as 1x1 depthwise copies written into a
    # CONCAT along C and then along W, each followed by a RESHAPE view, instead of a RESIZE (Vela's AvgPool-upscale,
    # about one output element a cycle on U55-128): measured per model (ethosu/measured.py)
    replicate_copies: bool = False
    # a whole-plane mean at the same scale as REDUCE_SUM instead of AVG_POOL2D (ops_pool), where exact, within these limits
    plane_sum: PlaneSumLimits | None = None
    # a whole-plane sum at a new scale (a mean's rounding once) as exact int32 row sums by a (1, W)
    # depthwise of ones, then REDUCE_SUM over H (reduction.int_sum), within these limits: Vela transposes
    # W times less int32 data than for one REDUCE_SUM over H*W, for W*C bytes of ones weights
    plane_rows: PlaneRowsLimits | None = None
    # ... or, before those, as exact int16 row sums by an AVG_POOL2D (1, W) of (x - zp) W in bands of rows, then
    # REDUCE_SUM over H (reduction.pooled_row_sums): no constant at all where Vela's REDUCE_SUM of a zero-point
    # input stores ones weights or a Sub constant; slower (MobileNetV3 block U55-128 0.57 -> 0.93 ms): size mode's
    plane_pool_rows: bool = False
    # layer norm: seed widened by one ADD next to an int32 operand; table index as one RESCALE (norm_rows)
    norm_widen_add: bool = False
    norm_index_rescale: bool = False
    # a strided conv that never reaches the last input rows/cols gets zero kernel taps, not a SLICE (ops_conv)
    conv_stride_taps: bool = False
    # softmax's exp in int32 for rows up to softmax_wide_row long and softmax_wide_max elements (softmax_int)
    softmax_wide: bool = False
    softmax_wide_row: int = 32
    softmax_wide_max: int = 512
    # ... and the int16 exp's per-row rounding shift moved into its int16 reciprocal, so one int16 MUL with a fused
    # RESCALE gives the output (softmax_int._divide_shift_mul): one full-size int32 shift fewer, but the reciprocal
    # keeps fewer bits on rows with larger sums (1 LSB off near rounding ties: exact_only leaves it out)
    softmax_shift_mul: bool = False
    # a rank-4 graph input of 2..planar_input_channels channels stays NCHW (planes) and is transposed on the
    # NPU (context.placeholder): Vela then reads it from DRAM in long bursts, not C bytes at a time (None: NHWC)
    planar_input_channels: int | None = None
    # ... and a rank-3 one read by 1-D ops, of 2..planar_1d_input_channels channels, stays NCL (None: NLC)
    planar_1d_input_channels: int | None = None
    # a rank-4 int8 graph input of at most 4 channels whose NHWC rows are at least this many bytes is first
    # copied as [N, H, 1, W*C] rows by a MAXIMUM, which Vela reads from DRAM in long bursts into SRAM, so the
    # first conv reads SRAM (input_staging.py; None: never)
    staged_input_min_row: int | None = None
    # every int8 graph input copied by a MAXIMUM before anything reads it (input_staging.py: the same integers):
    # with Dedicated_Sram an input a late op reads (a transformer's residual Add) stays live in the DRAM arena
    # until then, the copy in SRAM does not; size mode's memory choice (ethosu/measured.INPUT_COPY)
    input_copy: bool = False
    # a stride-2 int8 conv of at most this many input channels runs at stride 1 on the input's 2x2
    # space-to-depth view (4x the channels, same integers: space_to_depth.py; None: never)
    space_to_depth_channels: int | None = None
    # that view made by a 2x2 stride-2 CONV2D of one-hot weights (space_to_depth._view_by_conv), not a PAD and an
    # H/W-swapping TRANSPOSE of the input
    space_to_depth_conv: bool = False
    # a conv dilated past 2 as a kernel with zero taps at dilation 2 or 1 (ops_conv.taps_for_dilation), not
    # Vela's split into one conv per dilation phase
    dilation_taps: bool = False
    # a 1-D conv dilated by at least this much as an undilated (k, 1) conv on the phase view [N, L / d, d, C]
    # of its input (ops_conv.phase_view): no zero taps, no RESHAPE between a block's convs and Add (None: never)
    dilation_phase_min: int | None = None
    # a layer norm's / softmax's per-row statistics (the rsqrt / reciprocal chain) viewed as one channel row
    # [1, 1, 1, rows] (reduction.stats_as_channels): Vela runs per-row ops on [16, 1] as 16 blocks, on [1, 16] as one
    row_stats_channels: bool = False
    # a layer norm's variance from the int8 squares, K sum(x^2) - s^2, and t = s - K m0 per row (norm_rows; the same
    # integers as K sum(c^2) - t^2 with t = sum(c)): an int8 MUL instead of an int32 one, one REDUCE_SUM fewer
    norm_raw_squares: bool = False
    # a layer norm's gamma / beta depthwise conv on its rows as [1, 1, rows, K] instead of [1, rows, 1, K] (ops_norm)
    norm_affine_one_row: bool = False
    # ... and with no beta and no negative gamma as one RESCALE of the int16 normalised value instead (ops/norm.
    # _affine_as_rescale: the same integers), no per-channel bias and scale in Vela's weight stream; slower under
    # Vela's Performance on every family: size mode's memory choice (ethosu/measured.NORM_AFFINE_RESCALE)
    norm_affine_rescale: bool = False
    # ... and with a beta, as an int16 MUL by gamma and an int16 ADD of beta (ops/norm._affine_as_vectors): 4 bytes
    # a channel of constants for the depthwise's 10 of bias and scale; rounds the sum once, but not bit for bit as
    # the depthwise does (exact_only leaves it out): size mode's memory choice (ethosu/measured.NORM_AFFINE_FORMS)
    norm_affine_vectors: bool = False
    norm_affine_vectors_nodes: frozenset[str] = frozenset()  # ... on these LayerNormalization nodes only
    # ... and on these, the int16 MUL's int32 product plus beta as an int32 vector, one RESCALE to the output (6 bytes
    # a channel; Vela schedules the next conv's weights as after the depthwise where the int16 ADD's short pass
    # makes it buffer them whole: ethosu/measured.NORM_AFFINE_FORMS)
    norm_affine_wide_beta_nodes: frozenset[str] = frozenset()
    # a transposed conv whose kernel equals its stride (no two taps meet: a U-Net's 2x2 / 2 upsampling) as one
    # 1x1 CONV2D of every phase as channels, then the depth-to-space shuffle (ops_conv.phases_conv: the same
    # integers): Vela 5.2 leaves a TRANSPOSE_CONV2D's per-channel RESCALE unfused, an int32 MUL
    transpose_conv_phases: bool = False
    # an int8 conv whose kernel equals its stride, from this stride on, as a 1x1 conv of the input's patch view
    # (space_to_depth.patch_view: the same integers); Vela runs a stride past 3 as one conv per output (None: never)
    patch_conv_min_stride: int | None = None
    # an int conv strided from this stride on along W (at most 3 along H), kernel not its stride, as a stride-1 conv
    # of the input's W-block view (space_to_depth.column_blocks: the same integers; None: never)
    column_block_min_stride: int | None = None
    # DepthToSpace (DCR) as one channel SLICE per output row phase, stacked by a CONCAT, no TRANSPOSE (ops_resize)
    depth_to_space_rows: bool = False
    # a per-channel PRelu's two branches cut at the zero point with MAXIMUM / MINIMUM of the zero point (U85 runs
    # elementwise ops at 4 elements a cycle, a CLAMP as a 1x1 pool at 2), the same integers as the CLAMPs and
    # RESCALE (ops/unary._int_prelu_branches)
    prelu_elementwise: bool = False
    # a per-channel PRelu as the max / min of its two linear pieces, a 1x1 depthwise conv and the input's RESCALE,
    # in one MAXIMUM / MINIMUM (ops/unary._int_prelu_select: the same integers). U85 chains it onto the depthwise:
    # one or two passes over x, not three, but each depthwise reads its per-channel scales: every PRelu, or the
    # nodes named (ethosu/measured.py decides per node by Vela's per-layer estimate)
    prelu_select: bool = False
    # a MatMul of two feature maps as one broadcast int16 MUL of every product and a REDUCE_SUM over K (ops/conv.
    # _matmul_products: the same int32 sums), not Vela's MATMUL command sequence: every such MatMul, or the nodes
    # named (ethosu/measured.py decides per node on U65)
    matmul_products: bool = False
    matmul_products_nodes: frozenset[str] = frozenset()
    prelu_select_nodes: frozenset[str] = frozenset()
    # ... convs whose input is copied (a MAXIMUM of itself: the same integers) first, so a Concat output Vela leaves
    # in DRAM is read once in long bursts and the conv's many reads hit the SRAM copy (measured per node, U85)
    conv_input_copy_nodes: frozenset[str] = frozenset()
    # a SLICE or CONCAT of a RESCALE's result from int32 reads a full-range CLAMP of that result (the same integers),
    # which Vela fuses into the RESCALE's own NPU op: Vela 5.2 on U55/U65 otherwise runs the RESCALE, as a MUL, over
    # the unsliced tensor for each SLICE (a 16x8 GRU's reset gate read its update gate) and writes it at channel 0
    # of a CONCAT whatever its place (a 16x8 ppocrv4_rec): tests/npusim/test_vela_slice_rescale.py. U85 runs the
    # plain forms right, and there the CLAMP would cost an NPU op
    clamp_sliced_rescale: bool = False
    # a fully connected layer (constant-weight MatMul / Gemm) on these nodes as two 1x1 CONV2Ds of half its output
    # channels each and a CONCAT of them (ops/conv._fully_connected: the same integers). Vela buffers each half's
    # weights on its own: after a short pass (a layer norm's affine as vectors) it prebuffers little of a whole
    # FFN weight and buffers the rest in one slice (transformer U65-256 SRAM 12.50 -> 18.45 KiB); as halves it
    # slices as after the depthwise: size mode's memory choice (ethosu/measured.FC_HALVES)
    fc_halves_nodes: frozenset[str] = frozenset()
    # a per-row ADD / MUL of an int32 tensor and a scalar takes the scalar as its first operand, a SUB of a constant
    # is an ADD of its negation, a rounding right shift by a constant a MUL by one with that shift (intmath: the same
    # integers). Vela 5.2 runs a layer norm's [1, 1, 1, 16] statistics op with a scalar second operand in 128 U55
    # cycles, first in 20 (U55-128: transformer 203424 -> 201696, transformer_torch 198240 -> 196080; U65-256 and
    # U85-256 the same either way, mobilevit_block the same on all three)
    scalar_first: bool = False
    # a two-tensor Add's ADD with its operands in the other order (int32 addition commutes: the same integers).
    # Vela 5.2 orders a residual block's branches by the ADD's operands; on U55 a big conv right after the
    # weightless ADD has its weights fetched from flash during the ADD: measured per model (ethosu/measured.py)
    add_operands_swapped: bool = False
    # a two-operand int8 Add / Sub whose smaller scale is p / 64 of the larger (frontend/qdq_add_ratio.py) as a
    # CONCAT, a free view and one 1x2 DEPTHWISE_CONV2D (ops/elementwise._depthwise_sum: the same integers). Vela 5.2
    # costs a U55 ADD at 1.5 cycles an element, the conv at about a third (U55-128 32x32x16: 24576 -> 8896), but the
    # CONCAT moves Vela's schedule around it: measured per model on U55 (ethosu/measured.ADD_DEPTHWISE). U65 loses on
    # ResNet-8 (0.1017 -> 0.1060 ms); U85 runs the ADD chained to its producer (bench/u55_add_dw.md)
    add_as_depthwise: bool = False
    # a TRANSPOSE that is no single swap of two axis blocks as a chain of block swaps, each one TRANSPOSE of an
    # [A, X, Y, C] view by (0, 2, 1, 3) (emit.block_swaps: the same bytes moved): Vela 5.2 splits a high-rank
    # TRANSPOSE into a longer chain of its own (a MobileViT unfold: 15 TRANSPOSEs for 2 swaps). U55 and U85 take it;
    # U65 runs a swap of 2-byte rows slowly (selfie segmentation's depth-to-space): measured per model there
    transpose_block_swaps: bool = False
    # fold INT bias Adds behind a Q/DQ pair into the conv bias too (epilogue: exact per op to 1 LSB but drifts
    # from the QDQ reference, transformer TOSA SNR 32.8 -> 27.6 dB; off everywhere)
    int_bias_add: bool = False

    def planar_input(self, channels: int) -> bool:
        """Whether a rank-4 graph input of `channels` channels stays NCHW (planar_input_channels)."""
        return self.planar_input_channels is not None and 2 <= channels <= self.planar_input_channels

    def planar_1d_input(self, channels: int) -> bool:
        """Whether a rank-3 graph input of `channels` channels read by 1-D ops stays NCL."""
        return self.planar_1d_input_channels is not None and 2 <= channels <= self.planar_1d_input_channels

    def space_to_depth(self, channels: int) -> bool:
        """Whether a stride-2 conv of `channels` input channels runs on the 2x2 space-to-depth view."""
        return self.space_to_depth_channels is not None and channels <= self.space_to_depth_channels

    def depthwise_pays(self, x, out_q) -> bool:
        """Whether this int8 -> int8 requantisation (or copy) of `x` is cheaper as a 1x1 depthwise conv."""
        assert x.q is not None
        if len(x.shape) != 4 or x.dtype != np.int8 or np.dtype(out_q.dtype) != np.int8:
            return False
        _, h, w, c = x.shape
        lim = self.depthwise_limits
        return x.q.is_per_tensor and out_q.is_per_tensor and c <= lim.max_channels and h * w >= lim.min_plane

    def plane_sum_pays(self, x) -> bool:
        """Whether a whole-plane mean of int8 `x` at its own scale is cheaper as a REDUCE_SUM of the stored values
        (ops_pool._raw_mean), where that sum is bit-identical to the pool: n odd (no rounding tie), or n a power
        of two at the int8 minimum zero point (every tie above it).

        TOSA's AVG_POOL2D scales sum(x - zp) by its reciprocal_scale, 1/n * (1 + 2**-30), so it rounds a tie
        away from zero on sum(x - zp), down where the mean is below the zero point; round(sum(x) / n) at an
        exact 1/n rounds every tie up. A power of two at any other zero point was 1 LSB above the pool on such a
        mean: mp_selfie_segmentation's U55/U65 masks up to 41841 of 65536 pixels off model.tosa on its images
        (issue 33). Those keep the pool: exact sums of them measured on that model cost memory or cycles
        (bench/family_choices.md)."""
        lim = self.plane_sum
        if lim is None or x.q is None:
            return False
        count = x.shape[1] * x.shape[2]
        at_minimum = bool(np.all(np.asarray(x.q.zp) == np.iinfo(np.int8).min))
        exact = count % 2 == 1 or (count & (count - 1) == 0 and at_minimum)
        return x.dtype == np.int8 and exact and count >= lim.min_count and \
            lim.min_channels <= x.shape[3] <= lim.max_channels

    def plane_rows_pays(self, x) -> bool:
        """Whether the exact int32 sum of int8 `x` (NHWC) over H and W is cheaper as row sums first."""
        return self.plane_rows_fit(tuple(x.shape), np.dtype(x.dtype).str, x.q is not None and x.q.is_per_tensor)

    def plane_rows_fit(self, shape: tuple[int, ...], dtype: str, per_tensor: bool) -> bool:
        """plane_rows_pays on the facts of the tensor it reads: an observed predicate (`recorded`), so options
        whose row-sum limits differ but agree on every plane the model sums share its lowering."""
        lim = self.plane_rows
        if lim is None or len(shape) != 4 or np.dtype(dtype) != np.int8 or not per_tensor:
            return False
        _, h, w, c = shape
        return (min(h, w) >= max(lim.min_side, 2) and w <= lim.max_width and h * w >= lim.min_plane
                and h * w * c >= lim.min_elements and c <= lim.max_channels)

    def exact_only(self) -> LoweringOptions:
        """These options without the forms that round differently from the portable lowering (the int32
        softmax, the softmax's shift in its reciprocal, the bias-Add fold, the layer norm's affine vectors): every
        form left gives the portable lowering's integers for every input."""
        return replace(self, softmax_wide=False, softmax_shift_mul=False, int_bias_add=False,
                       norm_affine_vectors=False,
                       norm_affine_vectors_nodes=frozenset(), norm_affine_wide_beta_nodes=frozenset())

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
# The figures behind each family's choices: bench/family_choices.md ("Why each family takes what it takes"),
# bench/perf_choices.md.
EVERY_FAMILY = {"row_stats_channels": True, "patch_conv_min_stride": 4,  # per-row statistics, patch embeddings,
                "column_block_min_stride": 4}  # an STFT as a conv
NORM_U55_U65 = {"norm_raw_squares": True, "norm_affine_one_row": True}  # the layer norm's cheaper int8 forms
FAMILY_OPTIONS: dict[LoweringFamily, LoweringOptions] = {
    # U55 (decided on U55-128): the SRAM peak of in-order copies, the depthwise requantise and copy, bilinear 2x
    # without RESIZE in halves, the plane sums and the layer-norm forms
    "u55": LoweringOptions(**EVERY_FAMILY, **NORM_U55_U65, concat_order=True, dw_requantize=True,
                           concat_copy=ConcatCopy.DEPTHWISE,
                           depthwise_limits=DepthwiseLimits(max_channels=1 << 30, min_plane=0), bilinear_2x=True,
                           bilinear_channel_split=True, plane_sum=PlaneSumLimits(16, 16, 96),
                           norm_widen_add=True, norm_index_rescale=True, dilation_taps=True,
                           dilation_phase_min=4,
                           plane_rows=PlaneRowsLimits(min_side=8, min_plane=64, min_elements=3072, max_channels=256),
                           space_to_depth_channels=1, space_to_depth_conv=True, transpose_conv_phases=True,
                           clamp_sliced_rescale=True, scalar_first=True, transpose_block_swaps=True),
    # U65: U55's op set on a wider MAC array and bus: narrower depthwise and sum ranges, the upsample whole, narrow
    # inputs planar
    "u65": LoweringOptions(**EVERY_FAMILY, **NORM_U55_U65, concat_order=True, dw_requantize=True,
                           concat_copy=ConcatCopy.DEPTHWISE, bilinear_2x=True,
                           plane_sum=PlaneSumLimits(64, 32, 1 << 30), norm_widen_add=True, norm_index_rescale=True,
                           planar_input_channels=4, planar_1d_input_channels=8, dilation_taps=True,
                           dilation_phase_min=8,
                           plane_rows=PlaneRowsLimits(min_side=5, min_plane=100, min_elements=3072, max_channels=256),
                           space_to_depth_channels=1, transpose_conv_phases=True, clamp_sliced_rescale=True),
    # U85-128/256/512: the MAXIMUM copy after the skip-first order, zero taps, the int32 softmax, the staged input,
    # DepthToSpace as row-phase slices, PRelu's elementwise branches
    "u85": LoweringOptions(**EVERY_FAMILY, norm_affine_one_row=True, concat_order=True,
                           concat_copy=ConcatCopy.MAXIMUM, conv_stride_taps=True, softmax_wide=True,
                           dilation_taps=True, dilation_phase_min=4, plane_rows=PlaneRowsLimits(4, 49, 16384, 256),
                           staged_input_min_row=128, depth_to_space_rows=True, prelu_elementwise=True,
                           transpose_block_swaps=True),
    # U85-1024/2048: Vela's own Concat copy in the portable order (the reader conv is faster there); the rest as U85
    "u85wide": LoweringOptions(**EVERY_FAMILY, conv_stride_taps=True, softmax_wide=True, dilation_taps=True,
                               dilation_phase_min=2, plane_rows=PlaneRowsLimits(4, 100, 3072, 256),
                               staged_input_min_row=128, prelu_elementwise=True, transpose_block_swaps=True),
}

FIELDS = frozenset(LoweringOptions.__dataclass_fields__)
# predicates of plain, hashable arguments whose result, not the fields they read, a recorded lowering notes (`recorded`)
OBSERVED = frozenset({"plane_rows_fit"})


class Reads(set):
    """The names of the option fields a lowering read (a set), and `calls`: each OBSERVED predicate it asked, by
    (name, arguments), with the answer. The fields such a predicate reads are not in the set."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[tuple[str, tuple], object] = {}

    def agree(self, values: dict[str, object], options: LoweringOptions) -> bool:
        """Whether `options` has these `values` (this set's fields, as read) and answers every call alike: then a
        lowering with `options` observes what this one did, and makes its graph."""
        return all(getattr(options, name) == value for name, value in values.items()) and all(
            getattr(options, name)(*args) == answer for (name, args), answer in self.calls.items())


class _ReadsRecorded(LoweringOptions):
    """The same options, noting the name of every field read (by the lowering, its predicates, a replace()) and
    the answer of every OBSERVED predicate asked: what a lowering never observed cannot have changed its graph
    (see `recorded`)."""

    def __getattribute__(self, name: str):
        if name in FIELDS:
            reads = object.__getattribute__(self, "__dict__").get("_reads")
            if reads is not None:  # None: a copy made from these (replace), whose every field was read making it
                reads.add(name)
        elif name in OBSERVED:
            return _observed(self, name)
        return object.__getattribute__(self, name)


def _observed(options: _ReadsRecorded, name: str):
    """OBSERVED predicate `name` of `options`, noting its arguments and answer instead of the fields it reads."""
    state = object.__getattribute__(options, "__dict__")
    method = object.__getattribute__(options, name)

    def asked(*args):
        reads = state.get("_reads")
        state["_reads"] = None  # the fields it reads are summed up by its answer
        try:
            answer = method(*args)
        finally:
            state["_reads"] = reads
        if reads is not None:
            reads.calls[(name, args)] = answer
        return answer

    return asked


def recorded(options: LoweringOptions) -> tuple[LoweringOptions, Reads]:
    """`options` to lower with, and what fills with the names of the fields the lowering reads and the OBSERVED
    predicates' answers. A lowering is a function of the model, profile and what it observes of the options:
    options that agree with these on all of it (Reads.agree) lower the model to the same graph (the stage's
    Lowerings shares it instead of lowering again)."""
    copy = _ReadsRecorded(**{name: getattr(options, name) for name in LoweringOptions.__dataclass_fields__})
    reads = Reads()
    object.__setattr__(copy, "_reads", reads)
    return copy, reads
