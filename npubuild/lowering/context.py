"""The state one lowering carries: the ONNX graph being read and the TOSA graph being written.

Op lowerings (one module per op family, see registry.py) talk only to this
class: they read inputs as `TTensor`s (TOSA tensor + layout + quantisation),
read constants as numpy arrays, and emit TOSA ops. Layout is tracked per
tensor (`perm`: physical = logical.transpose(perm)) so that NCHW -> NHWC is
decided once per tensor, never by a transpose per op.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from typing import Literal

import numpy as np
import onnx
import tosa_serializer as ts
from onnx import numpy_helper

from npubuild.errors import UnsupportedOpError
from npubuild.frontend.graph_index import GraphIndex
from npubuild.lowering.options import PORTABLE, LoweringOptions
from npubuild.lowering.quant import INT4, INT48, QParams
from npubuild.records.iospec import IOSpec

NHWC = (0, 2, 3, 1)  # physical NHWC of a logical NCHW tensor
VELA_MAX_DIM = 65536  # Vela's largest tensor dimension
CHANNELS_LAST_1D = (0, 2, 1)  # physical [N, L, C] of a logical [N, C, L]

WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"})
ROW_ELEMENTWISE = frozenset({"Add", "Sub"})  # binary ops that compute on two RowImages as they are

NP_TO_TOSA = {
    np.dtype(np.int8): ts.DType.INT8,
    np.dtype(np.int16): ts.DType.INT16,
    np.dtype(np.int32): ts.DType.INT32,
    np.dtype(np.float32): ts.DType.FP32,
    np.dtype(np.bool_): ts.DType.BOOL,
    INT4: ts.DType.INT4,  # 4-bit weights and their zero point (EXT-INT4)
}
TENSOR_TYPES = {**NP_TO_TOSA, INT48: ts.DType.INT48}  # an int64 tensor of the lowering is TOSA's int48 accumulator


# A constant this small (a zero point, shift, multiplier, scalar, a SHAPE operand) is emitted once per distinct
# value and shared by every op reading it: MobileViT-xxs repeats 3,621 constants of 499 values, and the TOSA
# reference model looks tensors up by name in a list (quadratic in their count; bench/compile_speed.md).
# Weights and biases stay one tensor per op, as Vela encodes each op's own.
SHARED_CONST_BYTES = 16


_OP_KINDS: dict[ts.Op, str] = {}


def op_kind(op: ts.Op) -> str:
    """"RESCALE" for ts.Op.RESCALE: str() of a pybind11 enum builds its member table each call (~5-50 us, every op
    the lowering emits), so each kind's name is made once."""
    kind = _OP_KINDS.get(op)
    if kind is None:
        kind = _OP_KINDS[op] = str(op).split(".")[-1]
    return kind


def identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(perm))


@dataclass
class TTensor:
    """A TOSA tensor as the lowering sees it: name, physical shape, dtype, layout and quantisation."""

    name: str
    shape: tuple[int, ...]  # physical (TOSA) shape
    dtype: np.dtype
    perm: tuple[int, ...]  # physical = logical.transpose(perm)
    q: QParams | None = None

    @property
    def logical_shape(self) -> tuple[int, ...]:
        inv = inverse(self.perm)
        return tuple(self.shape[i] for i in inv)

    @property
    def is_nhwc(self) -> bool:
        return self.perm == NHWC


@dataclass
class QConst:
    """A constant integer tensor with its quantisation (a DequantizeLinear of an initializer)."""

    data: np.ndarray
    q: QParams

    def real(self) -> np.ndarray:
        return self.q.dequantize(self.data if self.q.axis is None else self.data).astype(np.float32)


@dataclass
class GraphInput:
    """A graph input not yet given a TOSA placeholder (its dtype depends on the QuantizeLinear after it)."""

    name: str
    shape: tuple[int, ...]
    elem_type: int


@dataclass
class RowImage:
    """A 1-D activation (logical [N, C, L]) held as the one-row NHWC image [N, 1, L, C] its ops compute on.

    1-D convs and pools, residual Adds, clamps and Q/DQ read and write the image directly
    (`LoweringContext.row_image`), so a Conv1d stack stays rank 4 end to end. The rank-3 [N, L, C]
    tensor is a RESHAPE emitted only when another reader asks for the value (`value`, `tensor`), once:
    Vela turns a RESHAPE whose input has other readers into a MemoryCopy (a TCN block input feeds both
    the next conv and the residual Add: 2160 cycles each on U55-128, bench/perf_choices.md).
    A value that reaches a graph output is never held so (its producer writes the rank-3 output).
    The image may also be a phase view [N, L / d, d, C] (element t at row t // d, column t % d: the same
    bytes), on which a conv dilated by d along time is an undilated (k, 1) conv
    (LoweringOptions.dilation_phase_min); `views` holds every shape the value was RESHAPEd to, once each.
    """

    image: TTensor
    flat: TTensor | None = None
    views: dict[tuple[int, int], TTensor] = field(default_factory=dict)  # (H, W) -> the value in that view

    @property
    def length(self) -> int:
        return self.image.shape[1] * self.image.shape[2]


Value = TTensor | QConst | GraphInput | np.ndarray | RowImage


@dataclass(frozen=True)
class ChannelRescale:
    """A RESCALE with a multiplier per channel (the last axis), as emit.rescale wrote it: a SLICE of its
    result is emitted as a SLICE of its source and the RESCALE of that slice's own channels.

    Vela 5.2 (regor) moves such a SLICE ahead of the RESCALE itself but keeps the scale stream of the first
    channels, so a slice that does not start at channel 0 is scaled with another channel's multipliers, on
    every Ethos-U (tests/npusim/test_vela_slice_rescale.py keeps the TOSA reproduction)."""

    source: str
    source_dtype: np.dtype
    multiplier: np.ndarray  # int32, one per channel
    shift: np.ndarray  # int8
    in_zp: str  # the zero-point constants' names
    out_zp: str
    attr: ts.TosaSerializerAttribute


@dataclass(frozen=True)
class WideRescale:
    """The result of a RESCALE from int32 that Vela runs as an op of its own (emit.FUSES_OUTPUT_RESCALE says which
    are not), and the op that wrote its int32 input: see LoweringOptions.clamp_sliced_rescale."""

    shape: tuple[int, ...]
    dtype: np.dtype
    source: str  # the TOSA op that wrote the RESCALE's input ("TABLE", "MAXIMUM", ... or "input")

    @property
    def slices_compile_right(self) -> bool:
        """A SLICE of a MAXIMUM's result: the softmax's row-max tree, whose halves one MAXIMUM reads. Vela 5.2
        compiles it right on U55/U65 (every softmax of the examples and real models is bit-exact in npu-sim),
        and a CLAMP there cost MobileViT's int8 build 2.1% of its U55 cycles (1698278 -> 1734470)."""
        return self.source == "MAXIMUM"


def initializer_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every initializer of `model` as a read-only array: an op lowering reads constants and never writes into
    one (a write raises), so one set of arrays serves every lowering of the model (ModelArrays)."""
    arrays = {}
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        array.flags.writeable = False
        arrays[init.name] = array
    return arrays


@dataclass(frozen=True, eq=False)
class ModelArrays:
    """One model's initializers as read-only arrays, converted once for all its lowerings, and the QParams of
    its Q/DQ nodes whose scale and zero point are initializers, read once: the lower stage lowers its model ~10
    times (each family and measured variant), and those were ~10% of each lowering on palm detection and
    PP-OCRv4 det. Both are functions of the model alone and read-only (a write raises). Valid for that very model
    object only (`for_model`): a copy that moved a Concat's weights (concat_order) or cut host nodes reads its own."""

    model: onnx.ModelProto
    arrays: Mapping[str, np.ndarray]
    qparams: dict[int, tuple[onnx.NodeProto, QParams]] = field(default_factory=dict)  # as LoweringContext._qparams

    @classmethod
    def of(cls, model: onnx.ModelProto) -> ModelArrays:
        return cls(model, initializer_arrays(model))

    def for_model(self, model: onnx.ModelProto) -> ModelArrays | None:
        """These, if `model` is the model they were made from, else None."""
        return self if model is self.model else None


@dataclass
class LoweringContext:
    model: onnx.ModelProto
    profile: Literal["int", "fp"]
    ser: ts.TosaSerializer = field(init=False)
    values: dict[str, Value] = field(default_factory=dict)
    index: GraphIndex = field(init=False)  # producers and readers of every ONNX tensor, through Q/DQ
    inputs: list[IOSpec] = field(default_factory=list)
    outputs: list[IOSpec] = field(default_factory=list)
    node_ops: dict[str, list[str]] = field(default_factory=dict)  # onnx node name -> TOSA op names
    fused: set[str] = field(default_factory=set)  # nodes already lowered as part of a fused pattern (skipped)
    channel_rescales: dict[str, ChannelRescale] = field(default_factory=dict)  # by result name: see ChannelRescale
    # results of a RESCALE from int32 that Vela runs as an op of its own (shape, dtype), and the full-range CLAMP a
    # SLICE or CONCAT reads instead where the family's options say so (LoweringOptions.clamp_sliced_rescale)
    wide_rescales: dict[str, WideRescale] = field(default_factory=dict)
    _sliced_copies: dict[str, str] = field(default_factory=dict)
    producers: dict[str, str] = field(default_factory=dict)  # TOSA tensor -> the op that wrote it ("ADD", ...)
    shape_values: dict[str, tuple[int, ...]] = field(default_factory=dict)  # shape_const name -> its values
    current: onnx.NodeProto | None = None
    options: LoweringOptions = PORTABLE  # the forms this family's lowering takes (lowering/options.py)
    _counter: int = 0
    _shared_consts: dict[tuple, str] = field(default_factory=dict)  # see const(): small values emitted once
    _qparams: dict[int, tuple[onnx.NodeProto, QParams]] = field(default_factory=dict)  # by id(node): qparams_of
    _shared_qparams: dict[int, tuple[onnx.NodeProto, QParams]] | None = field(default=None, init=False)
    # an index of `model` made already (concat_order's, when no Concat moved) and its initializers and QParams
    # read for every lowering of it (ModelArrays.for_model(model)): what __post_init__ would make, made once
    given_index: InitVar[GraphIndex | None] = None
    shared: InitVar[ModelArrays | None] = None

    def __post_init__(self, given_index: GraphIndex | None, shared: ModelArrays | None) -> None:
        self.ser = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
        g = self.model.graph
        if shared is not None:
            assert shared.model is self.model, "the arrays of another model"
            self._shared_qparams = shared.qparams
        self.values.update(shared.arrays if shared is not None else initializer_arrays(self.model))
        self.index = given_index if given_index is not None else GraphIndex(self.model)
        inits = {i.name for i in g.initializer}
        for vi in g.input:
            if vi.name in inits:
                continue
            dims = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
            self.values[vi.name] = GraphInput(vi.name, dims, vi.type.tensor_type.elem_type)

    @property
    def consumers(self) -> dict[str, list[onnx.NodeProto]]:
        return self.index.consumers

    @property
    def graph_outputs(self) -> list[str]:
        return self.index.output_names

    # ------------------------------------------------------------------ errors

    def unsupported(self, reason: str) -> UnsupportedOpError:
        node = self.current
        assert node is not None
        return UnsupportedOpError(node.name or f"<{node.op_type}>", node.op_type, reason)

    # ------------------------------------------------------------------ names and tensors

    def fresh(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}_{self._counter}"

    def const(self, data: np.ndarray, hint: str = "const", int48: bool = False) -> str:
        """A constant tensor; `int48` stores an int64 array as TOSA's int48 (a 16-bit conv's bias, an int48
        zero point), which no ONNX constant becomes otherwise (TOSA has no 64-bit integers)."""
        shape = np.shape(data)
        data = np.ascontiguousarray(data).reshape(shape)  # a rank-0 constant stays rank 0 (TOSA ranks must match)
        types = TENSOR_TYPES if int48 else NP_TO_TOSA
        if int48 and data.dtype != INT48:
            data = data.astype(INT48)
        if data.dtype not in types:
            if self.current is None:
                raise UnsupportedOpError("<graph>", "", f"a {data.dtype} constant has no TOSA type")
            raise self.unsupported(f"a {data.dtype} constant has no TOSA type (TOSA has no 64-bit integers)")
        name = self.fresh(hint)  # drawn even for a shared value: every other tensor keeps its name
        small = data.nbytes <= SHARED_CONST_BYTES
        key = (data.dtype.str, data.shape, data.tobytes()) if small else None  # never a weight's bytes copied
        if key is not None and key in self._shared_consts:
            return self._shared_consts[key]
        self.ser.addConst(list(data.shape), types[data.dtype], data, name=name)
        if key is not None:
            self._shared_consts[key] = name
        return name

    def shape_const(self, values: list[int] | tuple[int, ...]) -> str:
        name = self.fresh("shape")
        key = ("shape", tuple(int(v) for v in values))
        if key in self._shared_consts:
            return self._shared_consts[key]
        self.ser.addConst([len(values)], ts.DType.SHAPE, np.asarray(values, np.int64), name=name)
        self._shared_consts[key] = name
        self.shape_values[name] = key[1]
        return name

    def zp(self, value: int, dtype: np.dtype) -> str:
        """A zero-point operand of the given type (an int48 one for a RESCALE of an accumulator)."""
        return self.const(np.array([value], dtype=dtype), "zp", int48=np.dtype(dtype) == INT48)

    def new_tensor(
        self,
        shape: tuple[int, ...],
        dtype: np.dtype,
        perm: tuple[int, ...] | None = None,
        q: QParams | None = None,
        output_of: str | None = None,
    ) -> TTensor:
        """A new tensor; if `output_of` is a graph output (possibly through Q/DQ) it becomes a TOSA output."""
        dtype = np.dtype(dtype)
        if 0 in shape and self.current is not None:
            raise self.unsupported("zero-size tensors have no TOSA form")
        perm = perm if perm is not None else identity(len(shape))
        graph_out = self.index.graph_output_for(output_of) if output_of else None
        if graph_out is not None and graph_out not in {o.onnx_name for o in self.outputs}:
            t = self.ser.addOutput(list(shape), TENSOR_TYPES[dtype])
            tt = TTensor(t.name, tuple(shape), dtype, perm, q)
            self.outputs.append(self._io(graph_out, tt))
            return tt
        t = self.ser.addIntermediate(list(shape), TENSOR_TYPES[dtype])
        return TTensor(t.name, tuple(shape), dtype, perm, q)

    def real_const(self, name: str) -> np.ndarray | None:
        """A real-valued constant (an initializer, or a DequantizeLinear of one) as float64, or None."""
        v = self.values.get(name)
        if isinstance(v, np.ndarray) and name in self.index.inits:
            return v.astype(np.float64)
        node = self.index.producer.get(name)
        if node is not None and node.op_type == "DequantizeLinear" and node.input[0] in self.index.inits:
            data = self.values.get(node.input[0])
            if isinstance(data, np.ndarray):
                return self.qparams_of(node).dequantize(data)
        return v.real().astype(np.float64) if isinstance(v, QConst) else None

    def is_graph_output(self, value: str | None) -> bool:
        return value is not None and self.index.graph_output_for(value) is not None

    def _feeds_windows_only(self, name: str) -> bool:
        """Whether graph input `name` (through Q/DQ) is read by 1-D window ops as their input 0 and otherwise
        only by Add/Sub (a TCN block's residual Add of the input: RowImage)."""
        users = self.index.uses(name, [])
        windows = [u for u in users if u.op_type in WINDOW_OPS and self.index.source(u.input[0]) == name]
        return bool(windows) and all(u in windows or u.op_type in ROW_ELEMENTWISE for u in users)

    def nhwc_image(self, name: str) -> bool:
        """Whether graph input `name` (through Q/DQ) is read only by Transposes from NHWC to NCHW (perm
        0, 3, 1, 2): an NHWC image, as tf2onnx and onnx2tf export one, or a torch model that permutes its
        input. Laid out as it is, every reader sees the NCHW tensor in the NHWC bytes the NPU reads."""
        users = self.index.uses(name, [])
        return bool(users) and all(
            u.op_type == "Transpose" and [int(p) for a in u.attribute if a.name == "perm" for p in a.ints] == [0, 3, 1, 2]
            for u in users)

    @staticmethod
    def _io(onnx_name: str, t: TTensor) -> IOSpec:
        return IOSpec(
            onnx_name=onnx_name,
            tosa_name=t.name,
            shape=t.shape,
            perm=t.perm,
            dtype=t.dtype.name,
            scale=t.q.s if t.q is not None else None,
            zero_point=t.q.zp if t.q is not None else None,
        )

    def placeholder(self, gi: GraphInput, dtype: np.dtype, q: QParams | None) -> TTensor:
        if 0 in gi.shape and self.current is not None:
            raise self.unsupported(f"input '{gi.name}' is a zero-size tensor: no TOSA form")
        perm = NHWC if len(gi.shape) == 4 else identity(len(gi.shape))
        if len(gi.shape) == 4 and self.options.planar_input(gi.shape[1]):
            perm = identity(4)  # planar: the family reads it faster so (LoweringOptions.planar_input_channels)
        elif len(gi.shape) == 4 and not self.options.planar_input(gi.shape[3]) and \
                self.nhwc_image(gi.name):
            perm = identity(4)  # its ONNX layout is NHWC already: the Transpose to NCHW moves no byte
        if len(gi.shape) == 3 and self._feeds_windows_only(gi.name) and \
                not self.options.planar_1d_input(gi.shape[1]):
            perm = (0, 2, 1)  # [N, L, C]: what 1-D convolutions and pools read (lowering/spatial.py)
        shape = tuple(gi.shape[i] for i in perm)
        t = self.ser.addPlaceholder(list(shape), NP_TO_TOSA[np.dtype(dtype)])
        tt = TTensor(t.name, shape, np.dtype(dtype), perm, q)
        self.inputs.append(self._io(gi.name, tt))
        return tt

    def input_value(self, gi: GraphInput, dtype: np.dtype, q: QParams | None) -> TTensor | RowImage:
        """The placeholder of a graph input; one its 1-D ops read channels-last as a RowImage of it (its
        rank-3 form is the placeholder itself), so a residual Add of the input stays rank 4 too."""
        tt = self.placeholder(gi, dtype, q)
        readers = self.index.uses(gi.name, [])
        if len(tt.shape) != 3 or tt.perm != CHANNELS_LAST_1D or \
                not any(u.op_type in WINDOW_OPS - {"ConvTranspose"} for u in readers):  # one reads the image
            return tt
        n, length, c = tt.shape
        return RowImage(self._reshaped(tt, (n, 1, length, c), NHWC), flat=tt)

    def _reshaped(self, x: TTensor, shape: tuple[int, ...], perm: tuple[int, ...]) -> TTensor:
        """RESHAPE x (a free view of the same bytes) into a new tensor of that shape and layout."""
        t = self.ser.addIntermediate(list(shape), TENSOR_TYPES[x.dtype])
        attr = ts.TosaSerializerAttribute()
        attr.ReshapeAttribute()
        self.op(ts.Op.RESHAPE, [x.name, self.shape_const(list(shape))], [t.name], attr)
        return TTensor(t.name, tuple(shape), x.dtype, perm, x.q)

    # ------------------------------------------------------------------ reading the ONNX node

    def attr(self, name: str, default=None):
        assert self.current is not None
        for a in self.current.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def value(self, name: str) -> Value:
        """The lowered value of ONNX tensor `name`; a 1-D activation as its rank-3 tensor (see RowImage)."""
        try:
            v = self.values[name]
        except KeyError:
            raise self.unsupported(f"input '{name}' was not produced by a lowered node") from None
        return self._flat(v) if isinstance(v, RowImage) else v

    def row(self, i: int) -> RowImage | None:
        """Input i as a RowImage if it is a 1-D activation held as one, else None."""
        assert self.current is not None
        v = self.values.get(self.current.input[i]) if i < len(self.current.input) else None
        return v if isinstance(v, RowImage) else None

    def row_image(self, i: int, width: int | None = None) -> TTensor | None:
        """Input i's NHWC image if it is a 1-D activation held as one (RowImage), else None: `width` None
        gives it in the view it has, else in the view [N, L / width, width, C] (width L: one row)."""
        row = self.row(i)
        return None if row is None else (row.image if width is None else self.row_view(row, width))

    def row_view(self, row: RowImage, width: int) -> TTensor:
        """A RowImage in the view [N, L / width, width, C]: a RESHAPE of its image, emitted once."""
        img = row.image
        hw = (row.length // width, width)
        if hw == img.shape[1:3]:
            return img
        if hw not in row.views:
            row.views[hw] = self._reshaped(img, (img.shape[0], *hw, img.shape[3]), img.perm)
        return row.views[hw]

    def _flat(self, row: RowImage) -> TTensor:
        """The rank-3 [N, L, C] tensor of a RowImage: one RESHAPE, emitted on first use."""
        if row.flat is None:
            img = row.image
            row.flat = self._reshaped(img, (img.shape[0], row.length, img.shape[3]), CHANNELS_LAST_1D)
        return row.flat

    def tensor(self, i: int) -> TTensor:
        """Input i of the current node as an activation tensor (graph inputs get their placeholder here)."""
        assert self.current is not None
        name = self.current.input[i]
        v = self.value(name)
        if isinstance(v, GraphInput):
            if self.profile == "int":
                if v.elem_type != onnx.TensorProto.FLOAT:  # token ids, a mask: no int8 form to feed the NPU
                    kind = onnx.TensorProto.DataType.Name(v.elem_type).lower()
                    raise self.unsupported(f"input '{name}' is a graph input of type {kind}, not an int8 activation")
                raise self.unsupported(f"input '{name}' is a float graph input without QuantizeLinear")
            v = self.placeholder(v, np.float32, None)
            self.values[name] = v
        if isinstance(v, TTensor):
            return v
        if isinstance(v, QConst) and self.profile == "int":
            return self.materialize_const(v.data, v.q, hint="qconst")
        if isinstance(v, np.ndarray):
            return self.materialize_const(v.astype(np.float32) if v.dtype == np.float64 else v, None)
        raise self.unsupported(f"input {i} has an unexpected kind {type(v).__name__}")

    def materialize_const(self, data: np.ndarray, q: QParams | None, hint: str = "const") -> TTensor:
        perm = NHWC if data.ndim == 4 else identity(data.ndim)
        phys = np.transpose(data, perm)
        name = self.const(phys, hint)
        return TTensor(name, phys.shape, phys.dtype, perm, q)

    def constant(self, i: int) -> np.ndarray | None:
        """Input i as a real-valued numpy constant (dequantized if it is a QConst), or None."""
        assert self.current is not None
        if i >= len(self.current.input) or not self.current.input[i]:
            return None
        v = self.values.get(self.current.input[i])
        if isinstance(v, np.ndarray):
            return v
        if isinstance(v, QConst):
            return v.real()
        return None

    def qconst(self, i: int) -> QConst | None:
        assert self.current is not None
        if i >= len(self.current.input) or not self.current.input[i]:
            return None
        v = self.values.get(self.current.input[i])
        return v if isinstance(v, QConst) else None

    def has_input(self, i: int) -> bool:
        assert self.current is not None
        return i < len(self.current.input) and bool(self.current.input[i])

    def output_q(self, i: int = 0) -> QParams | None:
        """Quantisation of output i, from the QuantizeLinear that consumes it (INT profile)."""
        assert self.current is not None
        name = self.current.output[i]
        qs = [n for n in self.consumers.get(name, []) if n.op_type == "QuantizeLinear"]
        if not qs:
            return None
        return self.qparams_of(qs[0])

    def require_output_q(self, i: int = 0) -> QParams:
        q = self.output_q(i)
        if q is None:
            raise self.unsupported("its output is not quantized (no QuantizeLinear follows it)")
        return q

    def qparams_of(self, qnode: onnx.NodeProto) -> QParams:
        """QParams from a QuantizeLinear/DequantizeLinear node's scale and zero-point inputs; made once per node
        (a Q/DQ is read by its producer's and its readers' lowerings alike), the same frozen QParams shared."""
        known = self._qparams.get(id(qnode))
        if known is None and self._shared_qparams is not None:
            known = self._shared_qparams.get(id(qnode))
        if known is not None and known[0] is qnode:
            return known[1]
        q = self._read_qparams(qnode)
        self._qparams[id(qnode)] = (qnode, q)
        if self._shared_qparams is not None and all(not i or i in self.index.inits for i in qnode.input[1:]):
            self._shared_qparams[id(qnode)] = (qnode, q)  # read from the model's own arrays: the same in every lowering
        return q

    def _read_qparams(self, qnode: onnx.NodeProto) -> QParams:
        scale = self.values.get(qnode.input[1])
        zp = self.values.get(qnode.input[2]) if len(qnode.input) > 2 and qnode.input[2] else None
        if not isinstance(scale, np.ndarray) or (zp is not None and not isinstance(zp, np.ndarray)):
            raise UnsupportedOpError(qnode.name, qnode.op_type, "scale and zero point must be constants")
        axis = None
        for a in qnode.attribute:
            if a.name == "axis":
                axis = a.i
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise UnsupportedOpError(qnode.name, qnode.op_type, f"quantisation scale {scale.reshape(-1)[:4].tolist()} is "
                                     "not positive and finite (calibration data with inf or NaN?)")
        dtype = zp.dtype if zp is not None else np.dtype(np.uint8)
        zero = zp.astype(np.int64) if zp is not None else np.zeros(scale.shape, np.int64)
        if scale.size == 1:
            axis = None
        scale = scale.astype(np.float64)
        scale.flags.writeable = zero.flags.writeable = False  # shared by every reader of the node, in every lowering
        return QParams(scale, zero, np.dtype(dtype), axis)

    def set_output(self, i: int, t: Value) -> None:
        assert self.current is not None
        self.values[self.current.output[i]] = t

    # ------------------------------------------------------------------ emitting TOSA

    def _slice_ahead_of_rescale(self, inputs: list[str], output: str) -> None:
        """SLICE(RESCALE(x)) written as RESCALE(SLICE(x)) with the slice's own multipliers (ChannelRescale)."""
        r = self.channel_rescales[inputs[0]]
        begin, size = self.shape_values[inputs[1]], self.shape_values[inputs[2]]
        part = self.ser.addIntermediate(list(size), NP_TO_TOSA[np.dtype(r.source_dtype)])
        slice_attr = ts.TosaSerializerAttribute()
        slice_attr.SliceAttribute()
        self.op(ts.Op.SLICE, [r.source, inputs[1], inputs[2]], [part.name], slice_attr)
        channels = slice(begin[-1], begin[-1] + size[-1])
        mult = self.const(r.multiplier[channels], "multiplier")
        shift = self.const(r.shift[channels], "shift")
        self.op(ts.Op.RESCALE, [part.name, mult, shift, r.in_zp, r.out_zp], [output], r.attr)

    def _clamped_copy(self, name: str) -> str:
        """A full-range CLAMP of a RESCALE's result (made once): see LoweringOptions.clamp_sliced_rescale."""
        if name not in self._sliced_copies:
            r = self.wide_rescales[name]
            shape, dtype = r.shape, r.dtype
            info = np.iinfo(dtype)
            dt = NP_TO_TOSA[np.dtype(dtype)]
            copy = self.ser.addIntermediate(list(shape), dt)
            clamp_attr = ts.TosaSerializerAttribute()
            clamp_attr.ClampAttribute(ts.TosaSerializer.convertDataToUint8Vec(dt, np.array([info.min], dtype)),
                                      ts.TosaSerializer.convertDataToUint8Vec(dt, np.array([info.max], dtype)),
                                      ts.NanPropagationMode.PROPAGATE)
            self.op(ts.Op.CLAMP, [name], [copy.name], clamp_attr)
            self._sliced_copies[name] = copy.name
        return self._sliced_copies[name]

    def op(self, op, inputs: list[str], outputs: list[str], attr: ts.TosaSerializerAttribute | None = None) -> None:
        if attr is None:
            attr = ts.TosaSerializerAttribute()
        kind = op_kind(op)
        if kind == "SLICE" and inputs[0] in self.channel_rescales and len(outputs) == 1:
            self._slice_ahead_of_rescale(inputs, outputs[0])
            return
        if (kind == "SLICE" and self.options.clamp_sliced_rescale and inputs[0] in self.wide_rescales
                and not self.wide_rescales[inputs[0]].slices_compile_right):
            inputs = [self._clamped_copy(inputs[0]), *inputs[1:]]
        if kind == "CONCAT" and self.options.clamp_sliced_rescale:
            inputs = [self._clamped_copy(t) if t in self.wide_rescales else t for t in inputs]
        self.ser.addOperator(op, inputs, outputs, attr)
        key = self.current.name if self.current is not None else "<boundary>"
        self.node_ops.setdefault(key, []).append(kind)
        for out in outputs:
            self.producers[out] = kind
