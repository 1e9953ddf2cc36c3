"""A host partition's QDQ ONNX graph as TFLite builtin operators, for TensorFlow Lite Micro on the host CPU.

The host partition is what onnxruntime runs: int8 tensors dequantised, a float op, quantised again. Each ONNX
value becomes a TFLite tensor in the layout its producer wrote (physical = ONNX transposed by `perm`, as the
lowering lays tensors out) holding either the int8 codes of the value (`quant` set: the value is their
dequantisation, as DequantizeLinear gives it) or the float value itself. A node is translated by the
function registered for its op type (one per op family below, as ExecuTorch's Arm backend registers node
visitors); its float inputs come from a DEQUANTIZE of the int8 tensors, its float output goes to a QUANTIZE
where the graph quantises it: the same arithmetic as the QDQ model, so the result is within float rounding of
onnxruntime's (the partition check holds it to 1 LSB). An op type with no translation here is
`NotDeployable`, named by node and op type: such a partition runs on a Cortex-A host (onnxruntime), not on a
Cortex-M.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import numpy_helper
from tflite_micro.tensorflow.lite.micro.compression import model_editor as me
from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as tfl

from npubuild.deploy.tflite_graph import Quant, TflGraph, builtin_name, options

B = tfl.BuiltinOperator


class NotDeployable(Exception):
    """A host node TFLite Micro has no builtin for (on a Cortex-M it cannot run; a Cortex-A host runs the
    partition in onnxruntime)."""

    def __init__(self, node: onnx.NodeProto, reason: str):
        super().__init__(f"node '{node.name}' ({node.op_type}): {reason}")
        self.node, self.op_type, self.reason = node.name, node.op_type, reason


@dataclass(frozen=True)
class Value:
    """An ONNX value held by a TFLite tensor: physical layout np.transpose(onnx, perm); int8 (int16) codes when
    quant."""

    tensor: me.Tensor
    shape: tuple[int, ...]  # the ONNX shape
    perm: tuple[int, ...]
    quant: Quant | None = None
    kind: np.dtype | None = None  # the tensor's type when it is not int8 codes: float32 (default) or bool

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.quant.dtype) if self.quant is not None else np.dtype(self.kind or np.float32)

    @property
    def physical_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[p] for p in self.perm)


def identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


class HostTranslation:
    """The state of one host partition's translation: its values, the graph it writes into, what it used."""

    def __init__(self, graph: TflGraph, model: onnx.ModelProto):
        self.g = graph
        self.model = model
        self.values: dict[str, Value] = {}
        self.consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant":
                self.consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.builtins: set[str] = set()
        self._float: dict[int, Value] = {}
        self.node: onnx.NodeProto | None = None

    # --------------------------------------------------------------- emitting

    def op(self, code: int, inputs: list, outputs: list, opts=None) -> None:
        self.builtins.add(builtin_name(code))
        self.g.op(code, inputs, outputs, opts)

    def new(self, shape: tuple[int, ...], perm: tuple[int, ...], dtype=np.float32, quant: Quant | None = None,
            hint: str = "t") -> Value:
        v = Value(None, tuple(shape), tuple(perm), quant, None if quant else np.dtype(dtype))  # type: ignore[arg-type]
        t = self.g.tensor(self.g.fresh(hint), v.physical_shape, dtype, quant)
        return replace(v, tensor=t)

    def const(self, value: np.ndarray, hint: str = "c") -> me.Tensor:
        return self.g.const(np.ascontiguousarray(value), hint)

    def unsupported(self, reason: str) -> NotDeployable:
        assert self.node is not None
        return NotDeployable(self.node, reason)

    # --------------------------------------------------------------- values

    def value(self, name: str) -> Value:
        if name in self.values:
            return self.values[name]
        if name in self.consts:
            raise self.unsupported(f"input '{name}' is a constant where a tensor is expected")
        raise self.unsupported(f"input '{name}' is not computed before it")

    def in_layout(self, v: Value, perm: tuple[int, ...]) -> Value:
        """v laid out with `perm` (a TRANSPOSE when it differs)."""
        perm = tuple(perm)
        if v.perm == perm:
            return v
        out = self.new(v.shape, perm, v.dtype, v.quant, "transposed")
        # physical out[i] = onnx[perm[i]] = physical v[v.perm.index(perm[i])]
        order = np.array([v.perm.index(p) for p in perm], np.int32)
        self.op(B.TRANSPOSE, [v.tensor, self.const(order, "perm")], [out.tensor])
        return out

    def as_float(self, v: Value) -> Value:
        """The float value (DEQUANTIZE of int8 codes, once per tensor); a bool stays as it is."""
        if v.quant is None:
            return v
        key = id(v.tensor)
        if key not in self._float:
            out = self.new(v.shape, v.perm, np.float32, None, "dequantized")
            self.op(B.DEQUANTIZE, [v.tensor], [out.tensor])
            self._float[key] = out
        return self._float[key]

    def quantize(self, v: Value, quant: Quant) -> Value:
        """Codes of v at `quant` (QUANTIZE from float, or a requantisation of codes; none if equal)."""
        if v.quant == quant:
            return v
        out = self.new(v.shape, v.perm, np.dtype(quant.dtype), quant, "quantized")
        self.op(B.QUANTIZE, [v.tensor], [out.tensor])
        return out

    def float_input(self, i: int, perm: tuple[int, ...] | None = None) -> Value:
        v = self.as_float(self.value(self.node.input[i]))
        return self.in_layout(v, perm) if perm is not None else v

    def set_output(self, v: Value, i: int = 0) -> None:
        self.values[self.node.output[i]] = v

    def attr(self, name: str, default=None):
        for a in self.node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default


HostOp = Callable[[HostTranslation], None]
HOST_OPS: dict[str, HostOp] = {}


def host_op(*op_types: str):
    def register(fn: HostOp) -> HostOp:
        for t in op_types:
            HOST_OPS[t] = fn
        return fn
    return register


def _scalar(t: HostTranslation, name: str) -> float | int:
    v = t.consts.get(name)
    if v is None or v.size != 1:
        raise t.unsupported(f"'{name}' must be a constant scalar")
    return v.reshape(()).item()


# ------------------------------------------------------------------ quantisation


@host_op("QuantizeLinear")
def _quantize(t: HostTranslation) -> None:
    scale, zp = _scalar(t, t.node.input[1]), _scalar(t, t.node.input[2]) if len(t.node.input) > 2 else 0
    zdtype = t.consts[t.node.input[2]].dtype if len(t.node.input) > 2 else np.dtype(np.uint8)
    if zdtype not in (np.int8, np.int16) or (zdtype == np.int16 and zp != 0):
        raise t.unsupported(f"a {zdtype} quantisation at zero point {zp}; the deployable holds int8 tensors and "
                            "int16 ones at zero point 0")
    v = t.value(t.node.input[0])
    t.set_output(t.quantize(v if v.quant is not None else t.as_float(v), Quant(float(scale), int(zp), zdtype.name)))


@host_op("DequantizeLinear")
def _dequantize(t: HostTranslation) -> None:
    if t.node.input[0] in t.consts:  # a quantised constant (a table, an operand): its real values, a constant
        zp = t.consts[t.node.input[2]] if len(t.node.input) > 2 else 0
        q = t.consts[t.node.input[0]].astype(np.float64) - np.asarray(zp, np.float64)
        t.consts[t.node.output[0]] = (q * np.asarray(t.consts[t.node.input[1]], np.float64)).astype(np.float32)
        return
    v = t.value(t.node.input[0])
    scale, zp = _scalar(t, t.node.input[1]), _scalar(t, t.node.input[2]) if len(t.node.input) > 2 else 0
    zdtype = t.consts[t.node.input[2]].dtype.name if len(t.node.input) > 2 else "uint8"
    if v.quant != Quant(float(scale), int(zp), zdtype):
        raise t.unsupported("a DequantizeLinear whose parameters are not its input's")
    t.set_output(v)  # the value is the codes' dequantisation: DEQUANTIZE is emitted where a float op reads it


@host_op("Identity")
def _identity(t: HostTranslation) -> None:
    t.set_output(t.value(t.node.input[0]))


# ------------------------------------------------------------------ elementwise

UNARY = {"Exp": B.EXP, "Log": B.LOG, "Sqrt": B.SQRT, "Tanh": B.TANH, "Sigmoid": B.LOGISTIC, "Abs": B.ABS,
         "Neg": B.NEG, "Sin": B.SIN, "Cos": B.COS, "Floor": B.FLOOR, "Ceil": B.CEIL, "Round": B.ROUND,
         "Relu": B.RELU, "HardSwish": B.HARD_SWISH}
BINARY = {"Add": B.ADD, "Sub": B.SUB, "Mul": B.MUL, "Div": B.DIV, "Max": B.MAXIMUM, "Min": B.MINIMUM}
BINARY_OPTIONS = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "Div"}


@host_op(*UNARY)
def _unary(t: HostTranslation) -> None:
    x = t.float_input(0)
    out = t.new(x.shape, x.perm)
    t.op(UNARY[t.node.op_type], [x.tensor], [out.tensor])
    t.set_output(out)


def _operand(t: HostTranslation, name: str, like: Value) -> me.Tensor:
    """A binary op's operand in `like`'s layout: a constant broadcast to its rank and permuted, or a tensor."""
    if name in t.consts:
        c = _const_as(t, name, like.dtype)
        c = c.reshape((1,) * (len(like.shape) - c.ndim) + c.shape)
        return t.const(np.transpose(c, like.perm), "operand")
    v = t.as_float(t.value(name))
    if v.dtype == np.bool_ and like.dtype != np.bool_:
        raise t.unsupported("a boolean operand of an arithmetic op")
    if len(v.shape) < len(like.shape):  # numpy broadcasting: leading 1s
        v = _reshape_to(t, t.in_layout(v, identity(len(v.shape))), (1,) * (len(like.shape) - len(v.shape)) + v.shape)
    if len(v.shape) != len(like.shape):
        raise t.unsupported("operands of different rank")
    return t.in_layout(v, like.perm).tensor


def _const_as(t: HostTranslation, name: str, dtype: np.dtype) -> np.ndarray:
    """A constant in the type of the tensor it meets: float32 beside a float (or dequantised) value, int32 beside
    an index (the device's int64: device_dtype), bool beside a bool."""
    c = np.asarray(t.consts[name])
    if dtype == np.int32:
        if c.dtype.kind not in "iub" or (c.size and (c.min() < -2**31 or c.max() >= 2**31)):
            raise t.unsupported(f"constant '{name}' ({c.dtype}) does not fit the device's int32 tensor")
        return c.astype(np.int32)
    return c.astype(np.bool_ if dtype == np.bool_ else np.float32)


COMPARE = {"Greater": B.GREATER, "Less": B.LESS, "Equal": B.EQUAL, "GreaterOrEqual": B.GREATER_EQUAL,
           "LessOrEqual": B.LESS_EQUAL}
LOGICAL = {"And": B.LOGICAL_AND, "Or": B.LOGICAL_OR}


@host_op(*BINARY, *COMPARE, *LOGICAL)
def _binary(t: HostTranslation) -> None:
    a_name, b_name = t.node.input[0], t.node.input[1]
    if a_name in t.consts and b_name in t.consts:
        raise t.unsupported("both operands constant")
    like = t.as_float(t.value(a_name if a_name not in t.consts else b_name))
    shapes = [np.asarray(t.consts[n]).shape if n in t.consts else t.value(n).shape for n in (a_name, b_name)]
    rank = max(len(s) for s in shapes)
    if len(like.shape) < rank:  # a constant of higher rank (a [1] beside a scalar): the tensor gets its leading 1s
        like = _reshape_to(t, t.in_layout(like, identity(len(like.shape))),
                           (1,) * (rank - len(like.shape)) + like.shape)
    a, b = _operand(t, a_name, like), _operand(t, b_name, like)
    shape = tuple(int(d) for d in np.broadcast_shapes(like.shape, *shapes))
    code = {**BINARY, **COMPARE, **LOGICAL}[t.node.op_type]  # (ADD is builtin code 0)
    out = t.new(shape, like.perm, np.float32 if t.node.op_type in BINARY else np.bool_)
    kind = BINARY_OPTIONS.get(t.node.op_type)
    t.op(code, [a, b], [out.tensor], options(kind) if kind else None)
    t.set_output(out)


@host_op("Not")
def _not(t: HostTranslation) -> None:
    x = t.value(t.node.input[0])
    out = t.new(x.shape, x.perm, np.bool_)
    t.op(B.LOGICAL_NOT, [x.tensor], [out.tensor])
    t.set_output(out)


@host_op("Where")
def _where(t: HostTranslation) -> None:
    """SELECT_V2(cond, x, y), every operand in the layout of the first tensor among x and y."""
    cond_name, x_name, y_name = t.node.input
    tensor_name = next((n for n in (x_name, y_name) if n not in t.consts), None)
    if tensor_name is None or cond_name in t.consts:
        raise t.unsupported("a Where whose condition or both branches are constant")
    like = t.as_float(t.value(tensor_name))
    cond = t.value(cond_name)
    if len(cond.shape) > len(like.shape):
        raise t.unsupported("a condition of higher rank than its branches")
    if len(cond.shape) < len(like.shape):  # numpy broadcasting: leading 1s (a scalar gate over a vector)
        flat = t.in_layout(cond, identity(len(cond.shape)))
        cond = _reshape_to(t, flat, (1,) * (len(like.shape) - len(cond.shape)) + tuple(cond.shape))
    x, y = _operand(t, x_name, like), _operand(t, y_name, like)
    out = t.new(like.shape, like.perm)
    t.op(B.SELECT_V2, [t.in_layout(cond, like.perm).tensor, x, y], [out.tensor])
    t.set_output(out)


# ------------------------------------------------------------------ normalisation


@host_op("LRN")
def _lrn(t: HostTranslation) -> None:
    """x / (bias + alpha / size * sum of x^2 over the `size` channels around c) ** beta, on NHWC.

    TFLite Micro has no LOCAL_RESPONSE_NORMALIZATION: the window sum is a float 1x1 CONV_2D with a banded
    0/1 matrix scaled by alpha / size and the bias as its bias, the power exp(-beta log(.)).
    """
    size, alpha = int(t.attr("size")), float(t.attr("alpha", 1e-4))
    beta, bias = float(t.attr("beta", 0.75)), float(t.attr("bias", 1.0))
    x0 = t.value(t.node.input[0])
    if len(x0.shape) != 4:
        raise t.unsupported("LRN of a tensor that is not 4-D")
    x = t.float_input(0, (0, 2, 3, 1))  # NHWC: channels last
    channels = x.shape[1]
    sq = t.new(x.shape, x.perm)
    t.op(B.MUL, [x.tensor, x.tensor], [sq.tensor], options("Mul"))
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    band = np.zeros((channels, 1, 1, channels), np.float32)
    for c in range(channels):
        band[c, 0, 0, max(0, c - lo):min(channels, c + hi + 1)] = alpha / size
    den = t.new(x.shape, x.perm)
    t.op(B.CONV_2D, [sq.tensor, t.const(band, "lrn_band"), t.const(np.full(channels, bias, np.float32), "lrn_bias")],
         [den.tensor], options("Conv2D", padding=tfl.Padding.VALID, strideW=1, strideH=1))
    log = t.new(x.shape, x.perm)
    t.op(B.LOG, [den.tensor], [log.tensor])
    scaled = t.new(x.shape, x.perm)
    t.op(B.MUL, [log.tensor, t.const(np.full((1, 1, 1, 1), -beta, np.float32), "neg_beta")], [scaled.tensor],
         options("Mul"))
    factor = t.new(x.shape, x.perm)
    t.op(B.EXP, [scaled.tensor], [factor.tensor])
    out = t.new(x.shape, x.perm)
    t.op(B.MUL, [x.tensor, factor.tensor], [out.tensor], options("Mul"))
    t.set_output(out)


@host_op("Softmax")
def _softmax(t: HostTranslation) -> None:
    x0 = t.value(t.node.input[0])
    rank = len(x0.shape)
    axis = int(t.attr("axis", -1)) % rank
    perm = tuple(p for p in x0.perm if p != axis) + (axis,)  # the softmax axis last, the rest as they were
    x = t.float_input(0, perm)
    out = t.new(x.shape, x.perm)
    t.op(B.SOFTMAX, [x.tensor], [out.tensor], options("Softmax", beta=1.0))
    t.set_output(out)


# ------------------------------------------------------------------ linear algebra and reductions


@host_op("MatMul")
def _matmul(t: HostTranslation) -> None:
    """x @ W with W a constant matrix (a mel filterbank, a projection the spec keeps in float): FULLY_CONNECTED
    over the last axis with W transposed, keeping the leading dims."""
    x_name, w_name = t.node.input
    w = t.consts.get(w_name)
    if x_name in t.consts or w is None or np.asarray(w).ndim != 2:
        raise t.unsupported("a MatMul whose second operand is not a constant matrix")
    x0 = t.value(x_name)
    if len(x0.shape) < 2:
        raise t.unsupported("a MatMul of a vector")
    x = t.in_layout(t.as_float(x0), identity(len(x0.shape)))  # the contraction is over the ONNX last axis
    k, n = np.asarray(w).shape
    if x.shape[-1] != k:
        raise t.unsupported(f"a MatMul of {x.shape} by {np.asarray(w).shape}")
    out = t.new((*x.shape[:-1], n), identity(len(x.shape)))
    weights = t.const(np.asarray(w, np.float32).T, "matmul_weights")
    t.op(B.FULLY_CONNECTED, [x.tensor, weights, t.const(np.zeros(n, np.float32), "matmul_bias")], [out.tensor],
         options("FullyConnected", keepNumDims=True))
    t.set_output(out)


REDUCE = {"ReduceMax": B.REDUCE_MAX, "ReduceMin": B.REDUCE_MIN}


@host_op(*REDUCE)
def _reduce(t: HostTranslation) -> None:
    """REDUCE_MAX / REDUCE_MIN over constant axes (the attribute before opset 18, the second input after)."""
    x0 = t.value(t.node.input[0])
    rank = len(x0.shape)
    axes = t.attr("axes")
    if axes is None and len(t.node.input) > 1 and t.node.input[1]:
        if t.node.input[1] not in t.consts:
            raise t.unsupported("reduction axes that are not a constant")
        axes = t.consts[t.node.input[1]]
    axes = sorted({int(a) % rank for a in np.asarray(axes if axes is not None else range(rank)).ravel()})
    keep = bool(t.attr("keepdims", 1))
    x = t.in_layout(t.as_float(x0), identity(rank))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    out = t.new(shape, identity(len(shape)))
    t.op(REDUCE[t.node.op_type], [x.tensor, t.const(np.asarray(axes, np.int32), "axes")], [out.tensor],
         options("Reducer", keepDims=keep))
    t.set_output(out)


# ------------------------------------------------------------------ data movement


@host_op("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(t: HostTranslation) -> None:
    x0 = t.value(t.node.input[0])
    shape = _reshaped(x0.shape, t.consts.get(t.node.input[1]), bool(t.attr("allowzero", 0)))
    if shape is None:
        shape = _output_shape(t)
    x = t.in_layout(x0, identity(len(x0.shape)))  # a reshape is of the ONNX layout
    t.set_output(_reshape_to(t, x, shape))


def _reshape_to(t: HostTranslation, x: Value, shape: tuple[int, ...]) -> Value:
    """RESHAPE of x (in the ONNX layout) to `shape`, keeping its type: int8 codes, float or bool."""
    out = t.new(shape, identity(len(shape)), x.dtype, x.quant, "reshaped")
    t.op(B.RESHAPE, [x.tensor, t.const(np.asarray(shape, np.int32), "shape")], [out.tensor])
    return out


GATHER_TYPES = (np.dtype(np.float32), np.dtype(np.int8))  # what TensorFlow Lite Micro's GATHER kernel takes


@host_op("Gather")
def _gather(t: HostTranslation) -> None:
    """GATHER of a (dequantised) constant table or a tensor (float, or int32 indices of its own) by int32
    positions, constant or computed, in the ONNX layout."""
    data_name, idx_name = t.node.input[0], t.node.input[1]
    if data_name in t.consts:
        data = np.asarray(t.consts[data_name], np.float32)
        params, shape_d, dtype = t.const(data, "table"), data.shape, np.dtype(np.float32)
    else:
        v = t.in_layout(t.as_float(t.value(data_name)), identity(len(t.value(data_name).shape)))
        params, shape_d, dtype = v.tensor, v.shape, v.dtype
    axis = int(t.attr("axis", 0)) % len(shape_d)
    if idx_name in t.consts:  # a constant position (Silero's `sr[0]` on the host, beside its comparison)
        positions = _const_as(t, idx_name, np.dtype(np.int32))
        positions = np.where(positions < 0, positions + shape_d[axis], positions).astype(np.int32)
        idx = Value(t.const(positions, "positions"), positions.shape, identity(positions.ndim), None,
                    np.dtype(np.int32))
    else:
        idx = t.value(idx_name)
    if idx.dtype != np.int32:
        raise t.unsupported(f"{idx.dtype} indices: TensorFlow Lite Micro's GATHER takes int32 positions")
    idx = t.in_layout(idx, identity(len(idx.shape)))
    shape = (*shape_d[:axis], *idx.shape, *shape_d[axis + 1:])
    if dtype not in GATHER_TYPES:
        if idx_name not in t.consts or positions.size != 1:
            raise t.unsupported(f"a {dtype} table: TensorFlow Lite Micro's GATHER takes float32 or int8 ones")
        begin = np.zeros(len(shape_d), np.int32)
        begin[axis] = int(positions.ravel()[0])
        size = np.asarray([1 if k == axis else d for k, d in enumerate(shape_d)], np.int32)
        picked = t.new(tuple(int(d) for d in size), identity(len(shape_d)), dtype, None, "sliced")
        t.op(B.SLICE, [params, t.const(begin, "begin"), t.const(size, "size")], [picked.tensor])
        t.set_output(_reshape_to(t, picked, shape))
        return
    out = t.new(shape, identity(len(shape)), dtype)
    t.op(B.GATHER, [params, idx.tensor], [out.tensor], options("Gather", axis=axis, batchDims=0))
    t.set_output(out)


@host_op("Transpose")
def _transpose(t: HostTranslation) -> None:
    x = t.value(t.node.input[0])
    order = t.attr("perm") or list(reversed(range(len(x.shape))))
    shape = tuple(x.shape[p] for p in order)
    # the same bytes, read as the transposed ONNX tensor: onnx_out[i] = onnx_in[order[i]]
    t.set_output(Value(x.tensor, shape, tuple(order.index(p) for p in x.perm), x.quant))


def _reshaped(shape: tuple[int, ...], target: np.ndarray | None, allowzero: bool) -> tuple[int, ...] | None:
    """A Reshape's output shape from its constant target (ONNX's rules: 0 copies the input's dim unless
    allowzero, one -1 takes what is left); None when the target is not a constant."""
    if target is None:
        return None
    dims = [int(d) for d in np.asarray(target).ravel()]
    dims = [shape[i] if d == 0 and not allowzero else d for i, d in enumerate(dims)]
    if dims.count(-1) == 1:
        known = int(np.prod([d for d in dims if d != -1]))
        dims[dims.index(-1)] = int(np.prod(shape)) // known if known else 0
    return tuple(dims)


def _output_shape(t: HostTranslation) -> tuple[int, ...]:
    name = t.node.output[0]
    for vi in [*t.model.graph.value_info, *t.model.graph.output]:
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            if all(d > 0 for d in dims):
                return tuple(dims)
    raise t.unsupported("output shape not known statically")


# ------------------------------------------------------------------ partitions


def translate(t: HostTranslation) -> None:
    """Every node of the host partition, in graph order."""
    for node in t.model.graph.node:
        if node.op_type == "Constant":
            continue
        t.node = node
        if node.domain not in ("", "ai.onnx"):
            raise t.unsupported(f"operator domain '{node.domain}' has no TFLite builtin")
        fn = HOST_OPS.get(node.op_type)
        if fn is None:
            raise t.unsupported("no TFLite builtin translation (TensorFlow Lite Micro cannot run it)")
        fn(t)
    t.node = None


def emit_host_partition(graph: TflGraph, model: onnx.ModelProto, inputs: dict[str, Value],
                        outputs: dict[str, Value]) -> set[str]:
    """Translate one host partition into `graph`, reading the boundary tensors `inputs` and writing `outputs`
    (tensors the caller made, in the layout and quantisation their readers take). Returns the TFLite builtin
    operators it used; raises NotDeployable for a node TFLite Micro cannot run."""
    t = HostTranslation(graph, model)
    t.values.update(inputs)
    first = len(graph.sg.operators)
    translate(t)
    for name, target in outputs.items():
        if name not in t.values:
            raise NotDeployable(onnx.NodeProto(name=name, op_type="<output>"), "the partition does not compute it")
        v = t.in_layout(t.values[name], target.perm)
        v = t.quantize(v, target.quant) if target.quant is not None else t.as_float(v)
        write_into(t, v, target, first)
    return t.builtins


def write_into(t: HostTranslation, v: Value, target: Value, first: int) -> None:
    """Make the tensor the partition computed for an output be the boundary tensor: the op of this partition
    that wrote it writes the boundary tensor instead; a boundary input passed straight through is copied
    (RESHAPE: TensorFlow Lite Micro copies when input and output differ)."""
    sg = t.g.sg
    ours = sg.operators[first:]
    if not any(o is v.tensor for op in ours for o in op.outputs):
        t.op(B.RESHAPE, [v.tensor, t.const(np.asarray(target.physical_shape, np.int32), "shape")], [target.tensor])
        return
    for op in ours:
        op.outputs = [target.tensor if o is v.tensor else o for o in op.outputs]
        op.inputs = [target.tensor if i is v.tensor else i for i in op.inputs]
    sg.tensors = [x for x in sg.tensors if x is not v.tensor]
