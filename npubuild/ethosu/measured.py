"""Family choices decided per build by measurement, not by a threshold tuned on the examples.

A choice applies to some models only (`applies`); where it does, the family's lowering is made once per variant
of its options and each variant's whole graph compiled by Vela on the family's reference target (the shipped
profile config/accelerator.py names: FamilyFacts.measured_on), and the variant with Vela's shortest inference
time is the one the family lowers with. Every variant gives the same integers (a layout, a form of the same sums), so the choice moves time and
memory only. The lower stage's key holds Vela's version (stages/lower.py): the choice is made again when Vela
changes, and cached like any stage output otherwise.
"""

from __future__ import annotations

import copy
import functools
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from npubuild.config.accelerator import FAMILIES
from npubuild.frontend.graph_index import GraphIndex
from npubuild.frontend.qdq_add_ratio import depthwise_sums
from npubuild.lowering.driver import LoweredGraph
from npubuild.lowering.options import ConcatCopy, DepthwiseLimits, LoweringOptions

if TYPE_CHECKING:
    from npubuild.config.schema import TargetProfile
    from npubuild.ethosu.vela_cache import VelaCache


def narrow_nhwc_image(model: onnx.ModelProto, max_channels: int = 4) -> bool:
    """A rank-4 graph input of 2..max_channels channels in its last axis that the model reads only through
    Transposes to NCHW (perm 0, 3, 1, 2): an NHWC image as tf2onnx and onnx2tf export one."""
    index = GraphIndex(model)
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name in inits or len(dims) != 4 or not 2 <= dims[3] <= max_channels:
            continue
        users = index.uses(vi.name, [])
        if users and all(u.op_type == "Transpose" and [int(p) for a in u.attribute if a.name == "perm"
                                                        for p in a.ints] == [0, 3, 1, 2] for u in users):
            return True
    return False


def narrow_image(model: onnx.ModelProto, max_channels: int = 4) -> bool:
    """A rank-4 graph input of at most max_channels channels, NCHW or an NHWC image (narrow_nhwc_image)."""
    inits = {i.name for i in model.graph.initializer}
    return narrow_nhwc_image(model, max_channels) or any(
        len(dims) == 4 and 0 < dims[1] <= max_channels
        for vi in model.graph.input if vi.name not in inits
        for dims in [[d.dim_value for d in vi.type.tensor_type.shape.dim]])


@dataclass(frozen=True)
class Choice:
    """One measured choice: its name, when it applies, and the options of each variant besides the family's."""

    name: str
    applies: Callable[[onnx.ModelProto, LoweringOptions], bool]
    variants: Callable[[LoweringOptions], list[LoweringOptions]]
    # the variants where they name the model's nodes (used instead of `variants` when set)
    model_variants: Callable[[onnx.ModelProto, LoweringOptions], list[LoweringOptions]] | None = None

    def candidates(self, model: onnx.ModelProto, options: LoweringOptions) -> list[LoweringOptions]:
        return self.model_variants(model, options) if self.model_variants else self.variants(options)


# U65 reads a narrow image planar and TRANSPOSEs it on the NPU (its first conv read 3-byte pieces from DRAM).
# That wins on MobileNetV1 96x96 (33%) and MediaPipe face detection (128x128x3: 1.311 ms planar against 1.559
# as it is) and loses on hand landmarks (224x224x3 NHWC: 3.549 against 3.067) and the PP-LCNet orientation
# classifier (224x224x3 NCHW: its two TRANSPOSEs 482k cycles, the first conv the same): measured per model.
# U85 copies a narrow image input into SRAM in long rows before the first conv reads it (input_staging.py):
# MobileNetV1 96x96 U85-256 0.2384 -> 0.1863 ms, but MediaPipe hand landmarks (224x224x3) 3.380 -> 3.255 without
# it (its MAXIMUM copy 125k cycles, the conv no faster): measured per model.
# U65 did not stage (digits and the U-Nets gained, 1-channel stems lost: bench/perf_choices.md); its planar or
# as-is reads of a 3-channel image from DRAM cost MediaPipe selfie segmentation's first conv 1.08M cycles.
STAGED_INPUT = Choice("narrow image input staged into SRAM", lambda m, o: narrow_image(m),
                      lambda o: [replace(o, staged_input_min_row=None if o.staged_input_min_row is not None else 128)])
# U85-256 sums a small changing-scale plane (DS-CNN's 25x5x64 mean) in one REDUCE_SUM by its threshold (plane_rows'
# min_elements 16384: the row sums' ones weights cost 0.2-0.7 KiB of DRAM for 0.2-3.5% there, bench/perf_choices.md).
# Performance mode takes the time, size mode the memory: measured per model, the row sums for every plane they fit.
SMALL_PLANE_ROWS = Choice("row sums for small plane means",
                          lambda m, o: o.plane_rows is not None and o.plane_rows.min_elements > 0,
                          lambda o: [replace(o, plane_rows=replace(o.plane_rows, min_elements=0))])


# U55-128 keeps row sums to planes of at least 8 rows and columns; DS-CNN's 25x5x64 head and the KWS's narrow plane
# run faster with them too (0.1547 -> 0.1537, 0.0608 -> 0.0606 ms), other models' planes may not: measured per model.
NARROW_PLANE_ROWS = Choice("row sums for narrow plane means",
                           lambda m, o: o.plane_rows is not None and o.plane_rows.min_side > 2,
                           lambda o: [replace(o, plane_rows=replace(o.plane_rows, min_side=2, min_plane=0,
                                                                     min_elements=0))])


def has_op(model: onnx.ModelProto, op_type: str) -> bool:
    return any(n.op_type == op_type for n in model.graph.node)


# U85 keeps a TRANSPOSE_CONV2D whose kernel is its stride (a 2x2/2 U-Net upsample between small convs: 0.0557
# against 0.0756 ms as phases), but PP-OCRv4 det's FPN upsamples cost 1.46M of its 5.06M U85-256 cycles so:
# measured per model. (U55 / U65 keep the phases: the transposed conv measured slower on every model tried,
# selfie segmentation U65-256 included: 4.648 ms as phases, 4.802 as TRANSPOSE_CONV2D.)
PHASES = Choice("transposed conv as a 1x1 conv of its phases", lambda m, o: not o.transpose_conv_phases and
                has_op(m, "ConvTranspose"), lambda o: [replace(o, transpose_conv_phases=True)])
@dataclass(frozen=True)
class NodeChoice:
    """A form decided node by node: `nodes` are the ones it may apply to, `on(options, nodes)` the options with
    it on those. Both extremes are lowered and compiled once with Vela's per-layer estimate; each node takes
    the form under which its own layers cost fewer cycles, and that mix is compiled too: the best of the three
    whole graphs by Vela's figures is kept (a node's form moves its neighbours' schedule, which the per-layer
    charge does not see). Three Vela compiles where a search over the nodes would take one per node."""

    name: str
    nodes: Callable[[onnx.ModelProto, LoweringOptions], list[str]]
    on: Callable[[LoweringOptions, frozenset[str]], LoweringOptions]


# U85 chains a MAXIMUM / MINIMUM onto a depthwise conv: a per-channel PRelu as the max / min of its two pieces is
# one or two chained passes where its branches make three (palm detection's 96x96x32 maps in DRAM: 407k -> 297k
# cycles each). Each depthwise reads its per-channel scales, which Vela 5.2 charges once per OFM block: on
# palm's 12x12x256 PRelus two of them cost 112k cycles against the branches' 84k. So per node, by Vela's
# per-layer estimate. U55 / U65 chain nothing: the form loses there (palm U55-128 41.9 -> 63.7 ms).
PRELU_SELECT = NodeChoice("PRelu as max / min of its pieces",
                          lambda m, o: [] if o.prelu_select else [n.name for n in m.graph.node if n.op_type == "PRelu"],
                          lambda o, nodes: replace(o, prelu_select_nodes=nodes))


def convs_reading_concats(model: onnx.ModelProto) -> list[str]:
    """Conv nodes of more than one kernel tap whose input a Concat computes (through its Q / DQ pair)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    out = []
    for n in model.graph.node:
        kernel = next((list(a.ints) for a in n.attribute if a.name == "kernel_shape"), [])
        if n.op_type != "Conv" or not kernel or all(k == 1 for k in kernel):
            continue
        src = producer.get(n.input[0])
        while src is not None and src.op_type in ("QuantizeLinear", "DequantizeLinear"):
            src = producer.get(src.input[0])
        if src is not None and src.op_type == "Concat":
            out.append(n.name)
    return out


# With Dedicated_Sram Vela 5.2 may leave a Concat's output in DRAM (written piece by piece, long lived), and a 3x3
# conv then reads its windows from there: PP-OCRv4 det's FPN head conv over its 40x40x96 concat cost U85-256 1.26M
# cycles of DRAM reads (10% MAC utilisation; the whole model 3.26 ms, slower than on U65-256). A MAXIMUM copy of
# the concat as long rows first reads it once in bursts and the conv reads SRAM: the model lowered with the U85
# family's own options 4.30M -> 3.33M cycles (built: 3.26 -> 2.29 ms). Where the concat stays in SRAM (the U-Nets'
# skips) the copy only costs: per node, by Vela's per-layer estimate. U65-256 gains 1% on det (3.10M -> 3.07M):
# not worth its compiles there.
CONV_INPUT_COPY = NodeChoice("conv input copied out of DRAM", lambda m, o: convs_reading_concats(m),
                             lambda o, nodes: replace(o, conv_input_copy_nodes=nodes))


def feature_map_matmuls(model: onnx.ModelProto) -> list[str]:
    """MatMul nodes whose second operand is not a constant (an initializer, or one dequantised)."""
    inits = {i.name for i in model.graph.initializer}
    const = inits | {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] not in const]


# U65 runs a MatMul of two feature maps (Vela 5.2's MATMUL: a long command sequence, 36.9k cycles for the
# transformer's [4, 16, 16] x [4, 16, 16]) faster as one broadcast MUL of every product and a REDUCE_SUM (~25k:
# transformer U65-256 0.224 -> 0.178 ms), for the int32 products' SRAM (12.5 -> 83 KiB); U55-128 and U85-256
# lose (0.407 -> 0.643, 0.062 -> 0.091 ms): U65 only, per node, so size mode keeps MATMUL where memory grows.
MATMUL_PRODUCTS = NodeChoice("MatMul of feature maps as products and a sum",
                             lambda m, o: [] if o.matmul_products else feature_map_matmuls(m),
                             lambda o, nodes: replace(o, matmul_products_nodes=nodes))
# U55 replicates the bilinear 2x's pixels with depthwise copies into CONCATs instead of Vela's RESIZE (an AvgPool that
# upscales, about one output element a cycle on U55-128): unet 590969 -> 577909 cycles, unet_torch 644245 -> 625433
# (SRAM +5.2 KiB); a replication of few channels on a small plane may not gain: measured per model.
REPLICATE_COPIES = Choice("2x replication as depthwise copies into CONCATs",
                          lambda m, o: not o.replicate_copies and has_op(m, "Resize"),
                          lambda o: [replace(o, replicate_copies=True)])


def one_channel_strided_stems(model: onnx.ModelProto, channels: tuple[int, ...] = (1,)) -> bool:
    """Whether a 2-D Conv of stride 2 (undilated, one group) reads an input of one of these channel counts (a
    1-channel one by default): the stem lowering/space_to_depth.py can run on its 2x2 blocks. Its weights are an
    initializer, or one dequantised."""
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in shapes:
            shapes[node.output[0]] = shapes[node.input[0]]
    for node in model.graph.node:
        attrs = {a.name: list(a.ints) if a.ints else a.i for a in node.attribute}
        dims = shapes.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if (dims is not None and len(dims) == 4 and dims[1] in channels and attrs.get("strides") == [2, 2]
                and attrs.get("group", 1) == 1 and attrs.get("dilations", [1, 1]) == [1, 1]):
            return True
    return False


# U85 runs a 1-channel stride-2 stem near even either way: on its space-to-depth view made by a one-hot conv
# (lowering/space_to_depth.py) DS-CNN U85-256 0.0558 -> 0.0535 ms, KWS with its fused GELU 0.0199 -> 0.0197, but
# a lone 3x3 stem of a 28x28 image 2871 -> 3674 cycles (the TRANSPOSE view lost everywhere): measured per model.
STEM_SPACE_TO_DEPTH = Choice("1-channel stride-2 stem on its space-to-depth view",
                             lambda m, o: o.space_to_depth_channels is None and one_channel_strided_stems(m),
                             lambda o: [replace(o, space_to_depth_channels=1, space_to_depth_conv=True)])
# U65 makes that view by a TRANSPOSE or by a one-hot conv at about the same cost: the conv is faster in DS-CNN
# (0.0479 -> 0.0435 ms) and KWS (0.0212 -> 0.0185) and slower on a lone 3x3 stem of a 28x28 or 64x64 image
# (5568 -> 6661, 18205 -> 23773 cycles): measured per model.
SPACE_TO_DEPTH_CONV = Choice("space-to-depth view as a one-hot conv",
                             lambda m, o: o.space_to_depth_channels is not None and not o.space_to_depth_conv
                             and one_channel_strided_stems(m),
                             lambda o: [replace(o, space_to_depth_conv=True)])


WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def _ancestors(producer: dict[str, int], nodes: list[onnx.NodeProto], tensor: str) -> set[int]:
    """The indices of the nodes `tensor` is computed from (its producer included)."""
    seen: set[int] = set()
    stack = [tensor]
    while stack:
        at = producer.get(stack.pop())
        if at is not None and at not in seen:
            seen.add(at)
            stack.extend(i for i in nodes[at].input if i)
    return seen


def branched_adds(model: onnx.ModelProto) -> bool:
    """Whether the model has an Add of two tensors each computed through a weighted op (a conv, a Gemm, a
    MatMul) the other is not: the Adds whose operand order can move a weight fetch in Vela's schedule. An
    identity shortcut's operand is an ancestor of the other, so either order runs the same ops in turn; Adds
    with a weightless shortcut (palm and face detection's max pool and channel pad) or an identity one through
    its Q/DQ nodes (the transformers', mobilevit's) measured no different swapped, for one more Vela compile."""
    nodes = list(model.graph.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    inits = {i.name for i in model.graph.initializer}
    for node in nodes:
        if node.op_type != "Add" or len(node.input) != 2 or any(i in inits or not i for i in node.input):
            continue
        a, b = (_ancestors(producer, nodes, i) for i in node.input)
        if all(any(nodes[k].op_type in WEIGHTED_OPS for k in side) for side in (a - b, b - a)):
            return True
    return False


# U55 runs a residual ADD's two operands in either order (the same integers), and Vela 5.2 schedules the block's
# branches by that order: ResNet-8 U55-128 208228 -> 201644 cycles (resnet8_torch 210896 -> 204312) with the
# operands swapped, as each stage's 3x3 conv then runs right after the weightless ADD before it, its weights
# fetched from flash during the ADD (layer-23: 18072 -> 11488 cycles, its flash cycles 14272 -> 9696), +2.6 KiB SRAM; U85
# loses (89734 -> 91604), TCN and MobileNetV3 block do not move: measured per model (bench/u55_eltwise.md).
ADD_ORDER = Choice("residual Add operands swapped", lambda m, o: not o.add_operands_swapped and branched_adds(m),
                   lambda o: [replace(o, add_operands_swapped=True)])


# U55 runs a residual sum of two conv branches (both operands read by the sum alone, their scales in a 64ths
# ratio: frontend/qdq_add_ratio.py) as one 1x2 depthwise conv over their channel CONCAT in a third to a half of an
# ADD's cycles (bench/u55_add_dw.md), but that CONCAT moves Vela's schedule and SRAM around it: ResNet-8 U55-128
# 0.4033 -> 0.3949 ms, PP-OCRv4 det 8.784 -> 8.450 (SRAM 488 -> 751 KiB), MediaPipe face detection 5.003 -> 5.040,
# palm detection 41.77 -> 41.84: measured per model, before the operand order (which then orders the CONCAT).
ADD_DEPTHWISE = Choice("residual sums as depthwise convs",
                       lambda m, o: not o.add_as_depthwise and depthwise_sums(m) > 0,
                       lambda o: [replace(o, add_as_depthwise=True)])


# A 2- or 3-channel image stem (stride 2) on its space-to-depth view made by the one-hot conv (the view reads each
# pixel once, the stem then reads 12 channels at stride 1): issue 15 measured it only as a fixed form with the
# TRANSPOSE view, which lost everywhere (MobileNetV1 U65-256 0.1763 -> 0.2178 ms). By the conv view, on the real
# models' 224-320 px images lowered with each family's own options: U85-256 wins on the PP-LCNet orientation
# classifier (2.306M -> 2.119M cycles) and YOLOv8n (9.868M -> 9.558M) and loses on selfie segmentation (3.303M ->
# 3.766M); U65-256 wins on hand landmarks read as they are (3.067M -> 2.928M) and face detection (1.559M ->
# 1.448M) and loses on the orientation classifier and YOLOv8n; U55-128 lost on all four tried: measured per model
# on U65 and U85.
NARROW_STEM_SPACE_TO_DEPTH = Choice("2- or 3-channel stride-2 stem on its space-to-depth view",
                                    lambda m, o: (o.space_to_depth_channels or 0) < 3
                                    and one_channel_strided_stems(m, (2, 3)),
                                    lambda o: [replace(o, space_to_depth_channels=3, space_to_depth_conv=True)])


# U65 runs a high-rank TRANSPOSE as block swaps (emit.block_swaps) faster in the MobileViT block (1.512 -> 1.430 ms)
# but MediaPipe selfie segmentation's depth-to-space [128, 128, 2, 2] -> [128, 2, 128, 2] slower (3.982 -> 4.044 ms:
# its last swap moves 2-byte rows; U55-128 and U85-256 gain there too, 11.73 -> 11.50 and 3.151 -> 2.673 ms):
# measured per model.
BLOCK_SWAPS = Choice("TRANSPOSEs as chains of block swaps",
                     lambda m, o: not o.transpose_block_swaps and any(
                         has_op(m, t) for t in ("Transpose", "DepthToSpace", "SpaceToDepth", "ConvTranspose")),
                     lambda o: [replace(o, transpose_block_swaps=True)])

# U85 runs a DepthToSpace as row-phase SLICEs (depth_to_space_rows: 0.0756 -> 0.0452 ms against Vela's own chain for
# one TRANSPOSE), but as block swaps the TRANSPOSE form is the faster on that 32x16x16 sub-pixel model (21557 ->
# 17105 U85-256 cycles): measured per model.
D2S_SWAPS = Choice("DepthToSpace as block-swapped TRANSPOSEs",
                   lambda m, o: o.depth_to_space_rows and o.transpose_block_swaps and has_op(m, "DepthToSpace"),
                   lambda o: [replace(o, depth_to_space_rows=False)])


CHOICES: dict[str, tuple[Choice | NodeChoice, ...]] = {
    "u55": (NARROW_PLANE_ROWS, REPLICATE_COPIES, ADD_DEPTHWISE, ADD_ORDER),
    "u65": (MATMUL_PRODUCTS, SPACE_TO_DEPTH_CONV, Choice("narrow image input planar",
                                    lambda m, o: o.planar_input_channels is not None and narrow_image(m),
                                    lambda o: [replace(o, planar_input_channels=None)]), STAGED_INPUT, BLOCK_SWAPS,
            NARROW_STEM_SPACE_TO_DEPTH),
    "u85": (PRELU_SELECT, STAGED_INPUT, PHASES, SMALL_PLANE_ROWS, STEM_SPACE_TO_DEPTH, D2S_SWAPS, CONV_INPUT_COPY,
            NARROW_STEM_SPACE_TO_DEPTH),
    "u85wide": (PRELU_SELECT, STAGED_INPUT, PHASES, SMALL_PLANE_ROWS, STEM_SPACE_TO_DEPTH, CONV_INPUT_COPY,
                NARROW_STEM_SPACE_TO_DEPTH),
}


def _off(field: str) -> Choice:
    """A form that trades memory for time (constants, a copy), off: decided by memory in size mode."""
    off = getattr(LoweringOptions(), field)  # the portable lowering's value: the form not taken
    return Choice(f"{field} off (for memory)", lambda m, o: getattr(o, field) != off,
                  lambda o: [replace(o, **{field: off})])


def _on(field: str, op_types: tuple[str, ...]) -> Choice:
    """A form that trades time for memory, on where the model has one of `op_types`: decided by memory in size
    mode."""
    return Choice(f"{field} on (for memory)",
                  lambda m, o: not getattr(o, field) and any(has_op(m, t) for t in op_types),
                  lambda o: [replace(o, **{field: True})])


# optimise: size. The forms bench/perf_choices.md measured as buying time with memory: the row sums' ones
# weights and scales, the depthwise requantise and copies' per-channel constants, the layer norm's gamma / beta
# depthwise scales, zero kernel taps (weights), the staged input copy, the concat orders' copies, the upsample
# halves' shared row pad (its depthwise copy's constants: unet_torch U55-128 34.78 -> 34.44 KiB off-chip, SRAM
# 178.3 -> 177.3); each tried off and kept off where neither SRAM nor off-chip grows and one shrinks; U65's
# whole upsample tried in halves. Then the forms that store less than any
# of those for more time: a changing-scale plane mean's sum with no constant (MobileNetV3 block's SE and head
# means: 10.62 -> 9.50 KiB off-chip on U55-128, the ExecuTorch route's own figure, for 0.57 -> 0.96 ms), and a
# normalisation's affine step with no beta and no negative gamma (torch's default gamma = 1, beta = 0) as one
# RESCALE, not the depthwise conv: the same integers, no per-channel bias and scale (10 bytes a channel in Vela's
# weight stream: transformer_torch's four layer norms 77.44 -> 74.89 KiB off-chip on U55-128), slower under
# Vela's Performance everywhere (U55-128 0.408 -> 0.417, U65-256 0.179 -> 0.183, U85-256 0.0617 -> 0.0624 ms:
# Vela runs the lone RESCALE as a pass of its own), so measured in size mode only. Those figures are from before
# one positive gamma with no beta took no affine step at all (ops/norm._uniform_scale): the choice is now for
# per-channel gammas without a beta. A model whose affine steps all have a beta, or one gamma and no beta, lowers
# the same both ways and compiles nothing.
NORM_AFFINE_RESCALE = Choice("normalisation affine as a RESCALE",
                             lambda m, o: not o.norm_affine_rescale and (has_op(m, "LayerNormalization")
                                                                         or has_op(m, "InstanceNormalization")),
                             lambda o: [replace(o, norm_affine_rescale=True)])
# A layer norm's affine step with a beta as an int16 MUL by a gamma vector and an int16 ADD of a beta vector
# (ops/norm._affine_as_vectors): 4 bytes a channel of constants for the depthwise's 10 (the transformer's whole
# off-chip excess over ExecuTorch's: bench/perf_choices.md), rounded once but not bit for bit as the depthwise
# (the family's check holds it to the portable graph's error). transformer off-chip U55-128 77.02 -> 75.47 KiB
# (SRAM 9.25 both, 0.407 -> 0.427 ms), U85-256 78.11 -> 76.55 (SRAM 8.64 both, and faster: 0.0638 -> 0.0574 ms);
# on U65-256 Vela buffers the FFN weights whole after the short MUL / ADD (SRAM 12.5 -> 18.5 KiB): measured
# per model and family, kept where neither SRAM nor off-chip grows.
#
# Per layer norm, not per model (NodeForms): on U65-256 only the two layer norms that feed an FFN make Vela buffer
# its weights whole; the other two take the vectors at the same SRAM. A third form there, the int16 MUL's
# product plus an int32 beta (6 bytes a channel), keeps Vela's weight slicing but for 544 B of SRAM.
@dataclass(frozen=True)
class NodeForms:
    """Forms decided node by node by Vela's whole-graph figures (size mode's memory): a node's form is the
    options field (a frozenset of node names) that names it, none the family's own. First every node in each
    form at once, the best of those kept (`better`); then node by node, each moved to every other form, the
    best whole graph kept: a node's form moves its neighbours' schedule (Vela's weight buffering after a
    short pass), which no per-layer figure charges to it, so each step is one compile of each form."""

    name: str
    nodes: Callable[[onnx.ModelProto, LoweringOptions], list[str]]
    fields: tuple[str, ...]

    def placed(self, options: LoweringOptions, node: str, field: str | None) -> LoweringOptions:
        """`options` with `node` in form `field` (None: the family's own) and in no other."""
        return replace(options, **{f: getattr(options, f) - {node} | ({node} if f == field else set())
                                   for f in self.fields})

    def form(self, options: LoweringOptions, node: str) -> str | None:
        return next((f for f in self.fields if node in getattr(options, f)), None)


NORM_AFFINE_FORMS = NodeForms("normalisation affine form per layer norm",
                              lambda m, o: [] if o.norm_affine_vectors else
                              [n.name for n in m.graph.node if n.op_type == "LayerNormalization"],
                              ("norm_affine_vectors_nodes", "norm_affine_wide_beta_nodes"))


def fc_after_norm(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """(the widening ones, all) of the fully connected layers (MatMul / Gemm with a constant or dequantised constant
    weight) that read a LayerNormalization's output, through its QuantizeLinear / DequantizeLinear pair."""
    inits = {i.name for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}
    weights = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and
               n.input[0] in inits}
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    widening, every = [], []
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2 or not (n.input[1] in inits or n.input[1] in weights):
            continue
        src = producer.get(n.input[0])
        while src is not None and src.op_type in ("QuantizeLinear", "DequantizeLinear"):
            src = producer.get(src.input[0])
        if src is None or src.op_type != "LayerNormalization":
            continue
        every.append(n.name)
        dims = shapes.get(weights.get(n.input[1], n.input[1]), [])
        trans = n.op_type == "Gemm" and any(a.name == "transB" and a.i for a in n.attribute)
        if len(dims) == 2 and (dims[0] if trans else dims[1]) > (dims[1] if trans else dims[0]):
            widening.append(n.name)
    return widening, every


def _halves_with_vectors(model: onnx.ModelProto, options: LoweringOptions) -> list[LoweringOptions]:
    """FC_HALVES' variants, every layer norm's affine as vectors (the form whose short pass made Vela buffer the
    weights whole) in each: no layer in halves, the widening ones (an FFN's first), every one after a layer norm."""
    norms = frozenset(n.name for n in model.graph.node if n.op_type == "LayerNormalization")
    vectors = replace(options, norm_affine_vectors_nodes=norms, norm_affine_wide_beta_nodes=frozenset())
    return [vectors] + [replace(vectors, fc_halves_nodes=nodes)
                        for nodes in dict.fromkeys(frozenset(s) for s in fc_after_norm(model) if s)]


# A layer norm's affine as vectors (4 bytes a channel) before an FFN made Vela 5.2 buffer the FFN's first weights
# whole on U65-256: after a short pass it prebuffers little (its first slice is about the previous op's cycles
# of DMA: 3536 B after the wide-beta form's 1152-cycle RESCALE, 4720 after the depthwise's 1410) and buffers the
# rest in one slice (SRAM 12.50 -> 18.45 KiB for vectors on all four layer norms, 13.03 for the wide beta on the
# two before an FFN). With the fully connected layers after a layer norm in two output halves (each its own 1x1
# conv, the same integers) Vela buffers each half as after the depthwise, and the vectors fit: transformer
# U65-256 size mode 12.50 / 80.66 -> 12.50 / 79.89 KiB (0.2238 -> 0.2291 ms), under ExecuTorch's 13.50 / 80.31.
# Measured with the vectors on every layer norm (the layer-norm search after it then moves single nodes).
FC_HALVES = Choice("fully connected layers after a layer norm in halves, with the affine vectors",
                   lambda m, o: not o.norm_affine_vectors and any(fc_after_norm(m)), lambda o: [],
                   _halves_with_vectors)
# ... and after the layer norms' forms are decided node by node, the halves tried off again (U55-128 and U85-256
# take the vectors at the same SRAM without them: transformer 75.47 / 76.55 KiB off-chip, 75.50 / 76.58 with)
FC_HALVES_OFF = Choice("fully connected layers whole again (for memory)", lambda m, o: bool(o.fc_halves_nodes),
                       lambda o: [replace(o, fc_halves_nodes=frozenset())])
# Every int8 graph input copied by a MAXIMUM first (LoweringOptions.input_copy): with Dedicated_Sram (U65 / U85)
# an input a late op reads stays in the DRAM arena until then; the transformer's, read again by the residual Add,
# held 1 KiB of U65-256's off-chip (82.39 -> 81.39 KiB, SRAM 12.50 both, 0.2240 -> 0.2236 ms).
INPUT_COPY = Choice("input_copy on (for memory)", lambda m, o: not o.input_copy,
                    lambda o: [replace(o, input_copy=True)])
SIZE_CHOICES: tuple[Choice | NodeForms, ...] = tuple(_off(f) for f in (
    "plane_rows", "dw_requantize", "concat_copy", "norm_affine_one_row", "dilation_taps",
    "conv_stride_taps", "staged_input_min_row", "concat_order")) + (
    Choice("shared_row_pad off (for memory)", lambda m, o: o.bilinear_channel_split and o.shared_row_pad,
           lambda o: [replace(o, shared_row_pad=False)]),
    # copies and requantisations with no depthwise (RESCALE, Vela's copy, the MAXIMUM copy of a Concat input): no
    # per-channel constants (unet U55-128 off-chip 32.89 -> 32.63 KiB with the halves' row pad unshared)
    Choice("copies without a depthwise (for memory)", lambda m, o: o.depthwise_limits.max_channels > 0 and (
        o.dw_requantize or o.concat_copy == ConcatCopy.DEPTHWISE or o.bilinear_2x),
        lambda o: [replace(o, depthwise_limits=DepthwiseLimits(0, 1 << 30), concat_copy=ConcatCopy.MAXIMUM
                           if o.concat_copy == ConcatCopy.DEPTHWISE else o.concat_copy)]),
    # U65 upsamples whole for time; in halves its replicated intermediate's peak is half (unet_torch U65-256 SRAM
    # 195.0 -> 177.5 KiB, off-chip 38.72 -> 38.42, 0.364 -> 0.378 ms)
    Choice("bilinear_channel_split on (for memory)", lambda m, o: o.bilinear_2x and not o.bilinear_channel_split
           and has_op(m, "Resize"), lambda o: [replace(o, bilinear_channel_split=True)]),
    _on("plane_pool_rows", ("GlobalAveragePool", "AveragePool", "ReduceMean", "ReduceSum")), INPUT_COPY,
    NORM_AFFINE_RESCALE, FC_HALVES, NORM_AFFINE_FORMS, FC_HALVES_OFF)


def vela_figures_all(tosas: list[bytes], accelerator: str, optimise: str = "performance",
                     layers: bool = False, cache: VelaCache | None = None,
                     stem: Callable[[bytes], str] | None = None) -> list[dict | None]:
    """Vela's estimate for each whole TOSA graph on the shipped profile of `accelerator`: inference ms, SRAM and
    off-chip KiB (None where Vela fails). The compiles run at once, each in a fork of this process (Vela's import
    paid once: a fresh interpreter per compile cost ~0.3 CPU s, twice DS-CNN's whole compile). `optimise` "size"
    compiles with Vela's --optimise Size. `layers`: also Vela's per-layer rows (perf.parse_per_layer, no ONNX
    nodes yet) under "layers".

    `cache` (the build dir's Vela cache): each graph compiled as the vela stage compiles it (stage_command, the
    graph named `stem(tosa)`, the vela stage's name for it), so that the vela stage of a build on this very
    profile restores the compile of the graph chosen instead of compiling it again (ethosu/vela_cache.py); the
    debug database and per-layer CSV this writes cost ~15% a compile (bench/compile_real.md)."""
    from npubuild.ethosu.vela import run_vela_each, stage_command, vela_command
    from npubuild.ethosu.vela_ini import render_ini

    profile = shipped_profile(accelerator)
    opts = profile.vela.model_copy(update={"optimise": "Size"}) if optimise == "size" else profile.vela
    with tempfile.TemporaryDirectory(prefix="npubuild-choice-") as tmp:
        ini = Path(tmp) / "system.ini"
        ini.write_text(render_ini(profile))
        cmds, outs = [], []
        for i, tosa in enumerate(tosas):
            if cache is not None:  # a work dir each, as the vela stage's: the key holds the graph's file name
                work = Path(tmp) / f"c{i}"
                work.mkdir()
                src, out = work / f"{stem(tosa) if stem else 'model'}.tosa", work / "out"
                cmd = stage_command(src, ini, out, profile, opts)
            else:
                src, out = Path(tmp) / f"m{i}.tosa", Path(tmp) / f"out{i}"
                cmd = vela_command(src, ini, out, profile, opts) + (["--verbose-performance"] if layers else [])
            src.write_bytes(tosa)
            cmds.append(cmd)
            outs.append(out)
        procs = run_vela_each(cmds, Path(tmp), cache)
        return [_figures(out, layers) if proc.returncode == 0 else None for proc, out in zip(procs, outs, strict=True)]


@functools.cache
def shipped_profile(accelerator: str) -> TargetProfile:
    """The shipped target profile named `accelerator` (its YAML files, package data, parsed and validated once a
    process: vela_figures_all asked for it at each of its six calls in palm detection's lower stage, 0.1 CPU s).
    Shared: read it, never change it (vela_figures_all copies its Vela options)."""
    from npubuild.config.load import SHIPPED_ROOT, default_search_path, load_target

    return load_target(accelerator, default_search_path(SHIPPED_ROOT), None)[0]


def _figures(out: Path, layers: bool) -> dict | None:
    """One compile's figures from the CSVs Vela wrote in `out` (vela_figures_all)."""
    from npubuild.ethosu.perf import parse_per_layer
    from npubuild.ethosu.vela import parse_summary_csv

    summaries = sorted(out.glob("*_summary_*.csv"))
    if not summaries:
        return None
    row = parse_summary_csv(summaries[0])
    figures = {"ms": round(float(row["inference_time"]) * 1e3, 6),
               "sram_kib": round(float(row["sram_memory_used"]), 3),
               "offchip_kib": round(float(row["off_chip_flash_memory_used"]) + float(row["dram_memory_used"]), 3)}
    if layers:
        per_layer = sorted(out.glob("*_per-layer.csv"))
        if not per_layer:
            return None
        figures["layers"] = parse_per_layer(per_layer[0], {})
    return figures


def vela_figures(tosa: bytes, accelerator: str, optimise: str = "performance", layers: bool = False) -> dict | None:
    """vela_figures_all for one graph."""
    return vela_figures_all([tosa], accelerator, optimise, layers)[0]


def better(a: dict, b: dict, optimise: str) -> bool:
    """Whether figures `a` beat `b`: performance by time, and at the same time by memory (neither SRAM nor
    off-chip grows and one shrinks: PP-OCRv4 det's U55 Add order, 9.851 ms either way, SRAM 600.1 -> 487.6 KiB);
    size by memory, a variant taken only where neither grows and one shrinks (or both are equal and it is
    faster)."""
    mem_a, mem_b = (a["sram_kib"], a["offchip_kib"]), (b["sram_kib"], b["offchip_kib"])
    less_memory = mem_a != mem_b and all(x <= y for x, y in zip(mem_a, mem_b, strict=True))
    if optimise != "size":
        return a["ms"] < b["ms"] or (a["ms"] == b["ms"] and less_memory)
    if mem_a == mem_b:
        return a["ms"] < b["ms"]
    return less_memory


class Remembered:
    """`measure` (vela_figures_all's signature) compiling each graph once: every choice after the first compiles
    the form the last one took again as its own first candidate (palm detection: one Vela compile of four on
    U65, one of five on U85; PP-OCRv4 rec one of two on U65). Vela's estimate is a function of the graph,
    target and options, so a graph compiled before gives the figures it gave; a compile with the per-layer rows
    (--verbose-performance, which only writes the per-layer CSV) serves one asked without them. Each call gets
    its own copies (_by_node pops the layers)."""

    def __init__(self, measure: Callable[..., list[dict | None]]) -> None:
        self.measure = measure
        self.known: dict[tuple[bytes, str, str, bool], dict | None] = {}

    def _get(self, key: tuple[bytes, str, str, bool]) -> tuple[bool, dict | None]:
        """(found, figures) for `key`, a compile with the layers standing for one without (layers dropped)."""
        if key in self.known:
            return True, copy.deepcopy(self.known[key])
        with_layers = (*key[:3], True)
        if not key[3] and with_layers in self.known:
            figures = copy.deepcopy(self.known[with_layers])
            if figures is not None:
                figures.pop("layers", None)
            return True, figures
        return False, None

    def __call__(self, tosas: list[bytes], accelerator: str, optimise: str = "performance",
                 layers: bool = False) -> list[dict | None]:
        """The figures of each graph, compiling (at once, as `measure` does) only those not compiled before."""
        keys = [(t, accelerator, optimise, layers) for t in tosas]
        new = list(dict.fromkeys(k for k in keys if not self._get(k)[0]))
        if new:
            kwargs = {"layers": True} if layers else {}
            got = self.measure([k[0] for k in new], accelerator, optimise, **kwargs)
            self.known.update(zip(new, got, strict=True))
        return [self._get(k)[1] for k in keys]


def taken_of(figures: list[dict], optimise: str) -> int:
    """The index of the figures `better` takes; ties keep the earlier (the family's own form comes first)."""
    best = 0
    for i in range(1, len(figures)):
        if better(figures[i], figures[best], optimise):
            best = i
    return best


def choose(model: onnx.ModelProto, fam: str, lower: Callable[[LoweringOptions], LoweredGraph | None],
           measure: Callable[..., list[dict | None]] = vela_figures_all,
           optimise: str = "performance") -> tuple[LoweringOptions, list[dict]]:
    """The family's options with each applicable choice decided by Vela's estimate, and what was measured.

    `lower(options)` lowers the whole model with those options (None: no single graph, nothing to compare).
    `optimise` "size" adds the choices that trade memory for time (SIZE_CHOICES) and decides by memory.
    Each distinct graph is compiled once (Remembered)."""
    measure = Remembered(measure)
    options = LoweringOptions.for_family(fam)
    record = []
    choices = (*CHOICES.get(fam, ()), *(SIZE_CHOICES if optimise == "size" else ()))
    for choice in choices:
        if isinstance(choice, NodeChoice):
            options = _by_node(choice, model, fam, options, lower, measure, optimise, record)
            continue
        if isinstance(choice, NodeForms):
            options = _forms_by_node(choice, model, fam, options, lower, measure, optimise, record)
            continue
        if not choice.applies(model, options):
            continue
        candidates = [options, *choice.candidates(model, options)]
        graphs = [lower(opts) for opts in candidates]
        if any(g is None for g in graphs) or len({g.tosa for g in graphs}) == 1:
            continue  # no single graph to compare, or the choice changes nothing in this model
        figures = measure([g.tosa for g in graphs], FAMILIES[fam].measured_on, optimise)
        if any(f is None for f in figures):
            record.append({"choice": choice.name, "figures": figures, "taken": 0})
            continue
        best = taken_of(figures, optimise)
        record.append({"choice": choice.name, "target": FAMILIES[fam].measured_on, "figures": figures, "taken": best})
        options = candidates[best]
    return options, record


def node_cycles(lowered: LoweredGraph, layers: list[dict]) -> dict[str, int]:
    """Vela's cycles per ONNX node: each per-layer row charged to the node whose lowering made its output
    tensor (families.node_tensors' map; Vela's own inserted layers to the node after them)."""
    from npubuild.ethosu.perf import charge_nodes
    from npubuild.tosa.graph import ops_by_node, read_tosa, tensor_nodes

    try:
        owners = tensor_nodes(ops_by_node(read_tosa(lowered.tosa), lowered.node_ops))
    except ValueError:
        return {}
    cycles: dict[str, int] = {}
    for layer in charge_nodes(layers, owners):
        if layer.get("onnx_node"):
            cycles[layer["onnx_node"]] = cycles.get(layer["onnx_node"], 0) + (layer.get("cycles") or 0)
    return cycles


def _by_node(choice: NodeChoice, model: onnx.ModelProto, fam: str, options: LoweringOptions,
             lower: Callable[[LoweringOptions], LoweredGraph | None], measure: Callable[..., list[dict | None]],
             optimise: str, record: list[dict]) -> LoweringOptions:
    """`options` with `choice` decided per node (NodeChoice); what was measured appended to `record`."""
    nodes = choice.nodes(model, options)
    if not nodes:
        return options
    candidates = [options, choice.on(options, frozenset(nodes))]
    graphs = [lower(o) for o in candidates]
    if any(g is None for g in graphs) or graphs[0].tosa == graphs[1].tosa:
        return options
    target = FAMILIES[fam].measured_on
    figures = measure([g.tosa for g in graphs], target, optimise, layers=True)
    if any(f is None for f in figures):
        record.append({"choice": choice.name, "figures": figures, "taken": 0})
        return options
    per_node = [node_cycles(g, f.pop("layers")) for g, f in zip(graphs, figures, strict=True)]
    taken = frozenset(n for n in nodes if per_node[1].get(n, 0) < per_node[0].get(n, 0))
    if taken and taken != frozenset(nodes):
        mixed = choice.on(options, taken)
        graph = lower(mixed)
        mixed_figures = measure([graph.tosa], target, optimise)[0] if graph is not None else None
        if mixed_figures is not None:
            candidates.append(mixed)
            figures.append(mixed_figures)
    best = taken_of(figures, optimise)
    record.append({"choice": choice.name, "target": target, "figures": figures, "taken": best,
                   "nodes": {n: [per_node[0].get(n, 0), per_node[1].get(n, 0)] for n in nodes}})
    return candidates[best]


def _best_of(candidates: list[LoweringOptions], fam: str, lower: Callable[[LoweringOptions], LoweredGraph | None],
             measure: Callable[..., list[dict | None]], optimise: str, record: list[dict], name: str) -> int:
    """Which of `candidates` (the first the current options) Vela's figures take (`better`; ties keep the
    earlier); 0 where a lowering or a compile fails. Candidates lowering to the current graph are not compiled."""
    graphs = [lower(o) for o in candidates]
    if any(g is None for g in graphs):
        return 0
    current = graphs[0].tosa
    at = [0] + [i for i in range(1, len(graphs)) if graphs[i].tosa != current]
    if len(at) == 1:
        return 0
    target = FAMILIES[fam].measured_on
    figures = measure([graphs[i].tosa for i in at], target, optimise)
    if any(f is None for f in figures):
        record.append({"choice": name, "figures": figures, "taken": 0})
        return 0
    best = taken_of(figures, optimise)
    record.append({"choice": name, "target": target, "figures": figures, "taken": best})
    return at[best]


def _forms_by_node(choice: NodeForms, model: onnx.ModelProto, fam: str, options: LoweringOptions,
                   lower: Callable[[LoweringOptions], LoweredGraph | None], measure: Callable[..., list[dict | None]],
                   optimise: str, record: list[dict]) -> LoweringOptions:
    """`options` with `choice`'s form decided per node (NodeForms); what was measured appended to `record`."""
    nodes = choice.nodes(model, options)
    if not nodes:
        return options
    whole = [options]
    for field in choice.fields:
        every = options
        for node in nodes:
            every = choice.placed(every, node, field)
        whole.append(every)
    options = whole[_best_of(whole, fam, lower, measure, optimise, record, f"{choice.name}: every node")]
    if len(nodes) == 1:
        return options
    for node in nodes:
        now = choice.form(options, node)
        moved = [options] + [choice.placed(options, node, f) for f in (None, *choice.fields) if f != now]
        options = moved[_best_of(moved, fam, lower, measure, optimise, record, f"{choice.name}: {node}")]
    return options


def _main() -> None:  # pragma: no cover - a debugging aid: python -m npubuild.ethosu.measured MODEL.onnx FAMILY
    from npubuild.lowering.driver import lower_model

    model = onnx.load(sys.argv[1])
    print(choose(model, sys.argv[2], lambda o: lower_model(model, "int", options=o))[1])


if __name__ == "__main__":  # pragma: no cover
    _main()
