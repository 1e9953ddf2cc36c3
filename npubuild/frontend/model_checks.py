"""What a model file must get right before native code (onnx's checker, shape inference) or the quantiser
reads it: each failure one line naming the node and op type, or the initializer and the node it feeds.

These are the cases measured to crash or mislead later stages: a zero stride or dilation is a division by
zero (SIGFPE) in shape inference; an initializer of an unknown data type, or whose bytes do not match its
shape, fails deep inside onnx-ir; NaN, Inf or huge weights make onnxruntime's quantiser assert ("scale
issue"); a model without graph inputs has nothing to calibrate or feed; an input of a type npubuild cannot
feed (complex, bool, strings) would be fed float32.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from npubuild.errors import InputError, UnsupportedOpError
from npubuild.frontend.external_data import model_tensors, tensor_nbytes

WINDOW_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
              "MaxUnpool", "DeformConv", "Col2Im", "MaxRoiPool"}
POSITIVE = ("strides", "dilations", "kernel_shape")
NON_NEGATIVE = ("pads", "output_padding")
POSITIVE_SCALAR = {"group": 1, "blocksize": 1}  # Conv group, DepthToSpace/SpaceToDepth blocksize
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
MAX_ABS_WEIGHT = 1e30  # beyond this a float32 quantisation scale overflows on the way (range / 255)
MIN_SCALE = 1e-30
FEEDABLE = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT8, TensorProto.UINT8,
            TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL}  # half: as float32 (float32_compute)


def check_model(model: onnx.ModelProto, where: str) -> None:
    """Raise InputError (one line) for the first problem found; cheap: one pass over nodes and tensors.
    An infinite constant is allowed where it bounds a Min, Max or Clip on the side it leaves unchanged
    (TensorFlow's clip_by_value(x, lo, inf)): the infinite_bounds pass removes it, and check_finite
    refuses whatever infinity the import passes leave."""
    bad = first_non_utf8_string(model)
    if bad is not None:
        raise InputError(f"not a valid ONNX model: string field {bad} is not UTF-8 (a damaged file?)", where)
    _check_inputs(model.graph, where)
    for node in model.graph.node:
        _check_node(node, where)
    readers = _first_readers(model.graph)
    bounds = identity_bound_tensors(model.graph)
    for t, what in model_tensors(model):
        _check_tensor(t, what + readers.get(t.name, "") if what.startswith("initializer") else what, where,
                      infinite_ok=what in bounds)


def check_finite(model: onnx.ModelProto, where: str) -> None:
    """No infinite constant is left after the import passes (an infinite bound they could not remove)."""
    readers = _first_readers(model.graph)
    for t, what in model_tensors(model):
        if t.data_type in FLOAT_TYPES and t.data_location != TensorProto.EXTERNAL and math.prod(t.dims) > 0:
            _check_tensor(t, what + readers.get(t.name, "") if what.startswith("initializer") else what, where)


def identity_bound_tensors(graph: onnx.GraphProto) -> set[str]:
    """Every constant of the main graph (initializer or Constant node value, named as model_tensors names it)
    that only Min, Max and Clip read, each as a bound on the side where it changes nothing
    (frontend/passes/infinite_bounds.py)."""
    from npubuild.frontend.passes.infinite_bounds import BOUND_OPS, identity_bound

    uses: dict[str, list[tuple[str, int]]] = {}
    _collect_uses(graph, uses)
    found: set[str] = set()
    constants = [(t.name, t, f"initializer '{t.name}'") for t in graph.initializer]
    constants += [(n.output[0], a.t, f"node '{n.name}' (Constant) attribute 'value'") for n in graph.node
                  if n.op_type == "Constant" and n.output for a in n.attribute if a.name == "value" and a.HasField("t")]
    for name, t, label in constants:
        readers = uses.get(name, [])
        if not readers or t.data_type not in FLOAT_TYPES or not all(op in BOUND_OPS for op, _ in readers):
            continue
        try:
            values = numpy_helper.to_array(t)
        except (ValueError, TypeError):
            continue
        if all(identity_bound(op, index, values) for op, index in readers):
            found.add(label)
    return found


def _collect_uses(graph: onnx.GraphProto, uses: dict[str, list[tuple[str, int]]]) -> None:
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name:
                uses.setdefault(name, []).append((node.op_type if node.domain in ("", "ai.onnx") else "", index))
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _collect_uses(sub, uses)


def first_non_utf8_string(message, path: str = "") -> str | None:
    """The path of the first string field whose bytes are not UTF-8 (protobuf hands those back as bytes), None
    if every one is text: onnx's checker and onnx-ir fail on them with a UnicodeDecodeError or a SerdeError
    (a byte flipped in a model's producer name was an internal error)."""
    for fd, value in message.ListFields():
        name = f"{path}.{fd.name}" if path else fd.name
        values = list(value) if fd.is_repeated else [value]
        if fd.type == fd.TYPE_STRING:
            for i, v in enumerate(values):
                if isinstance(v, bytes):
                    return name + (f"[{i}]" if fd.is_repeated else "")
        elif fd.type == fd.TYPE_MESSAGE:
            for i, sub in enumerate(values):
                found = first_non_utf8_string(sub, name + (f"[{i}]" if fd.is_repeated else ""))
                if found is not None:
                    return found
    return None


def _check_inputs(graph: onnx.GraphProto, where: str) -> None:
    inits = {i.name for i in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in inits]
    if not inputs:
        raise InputError("the model has no graph inputs: there is nothing to feed or calibrate", where)
    for vo in graph.output:  # a sequence or map output (SplitToSequence...): nothing downstream holds one
        if vo.type.WhichOneof("value") not in (None, "tensor_type"):
            kind = vo.type.WhichOneof("value").removesuffix("_type")
            raise InputError(f"output '{vo.name}' is a {kind}, not a tensor: npubuild builds models whose "
                             "outputs are tensors", where)
    for vi in inputs:
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"input '{vi.name}' is not a tensor", where)
        elem = vi.type.tensor_type.elem_type
        if elem not in FEEDABLE:
            name = TensorProto.DataType.Name(elem) if elem in TensorProto.DataType.values() else str(elem)
            raise InputError(f"input '{vi.name}' has type {name}; npubuild feeds float (float16 and bfloat16 as "
                             "float32), int8, uint8, int16, int32, int64 and bool inputs", where)


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    for a in node.attribute:
        if a.name == name:
            if a.type == onnx.AttributeProto.INTS:
                return list(a.ints)
            return [a.i] if a.type == onnx.AttributeProto.INT else None  # a wrong type: the checker names it
    return None


def _check_node(node: onnx.NodeProto, where: str) -> None:
    label = node.name or (node.output[0] if node.output else "")
    if node.op_type in WINDOW_OPS:
        for attr in POSITIVE:
            values = _ints(node, attr)
            if values is not None and any(v < 1 for v in values):
                raise UnsupportedOpError(label, node.op_type, f"{attr} {values} must all be at least 1", where)
        for attr in NON_NEGATIVE:
            values = _ints(node, attr)
            if values is not None and any(v < 0 for v in values):
                raise UnsupportedOpError(label, node.op_type, f"{attr} {values} must not be negative", where)
    for attr, least in POSITIVE_SCALAR.items():
        values = _ints(node, attr)
        if values is not None and any(v < least for v in values):
            raise UnsupportedOpError(label, node.op_type, f"{attr} {values[0]} must be at least {least}", where)


def _first_readers(graph: onnx.GraphProto) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in graph.node:
        for name in node.input:
            out.setdefault(name, f" (input of node '{node.name}' ({node.op_type}))")
    return out


def _check_tensor(t: TensorProto, what: str, where: str, infinite_ok: bool = False) -> None:
    if t.data_type == TensorProto.UNDEFINED or t.data_type not in TensorProto.DataType.values():
        raise InputError(f"{what} has an invalid data type {t.data_type}", where)
    if any(d < 0 for d in t.dims):
        raise InputError(f"{what} has a negative dim in {list(t.dims)}", where)
    if t.data_location == TensorProto.EXTERNAL:
        return  # folded (and checked) by external_data before this runs; left only by callers that do not fold
    expected = tensor_nbytes(t)
    n = math.prod(t.dims)
    if t.HasField("raw_data"):
        if expected is not None and len(t.raw_data) != expected:
            raise InputError(f"{what} has {len(t.raw_data)} bytes of data, its shape {list(t.dims)} needs "
                             f"{expected}", where)
    elif n > 0 and not (t.float_data or t.int32_data or t.int64_data or t.double_data or t.uint64_data
                        or t.string_data):
        raise InputError(f"{what} has shape {list(t.dims)} but no data", where)
    if t.data_type in FLOAT_TYPES and n > 0:
        try:
            values = numpy_helper.to_array(t)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{what}: cannot read its data ({exc})", where) from None
        with np.errstate(all="ignore"):
            finite = np.isfinite(values)
            if infinite_ok and not np.isnan(values).any():
                return
            if not finite.all():
                bad = values[~finite].ravel()[0]
                raise InputError(f"{what} holds {'NaN' if np.isnan(bad) else bad} values", where)
            peak = float(np.max(np.abs(values.astype(np.float64))))
        if peak > MAX_ABS_WEIGHT:
            raise InputError(f"{what} holds values up to {peak:.3g}, beyond +-{MAX_ABS_WEIGHT:g} (float32 "
                             "arithmetic and int8 scales overflow on them)", where)


def check_scales(graph: onnx.GraphProto, where: str) -> None:
    """Quantisation scales of Q/DQ nodes (a model quantised by another tool): positive, finite, and within
    [MIN_SCALE, MAX_ABS_WEIGHT], or no integer RESCALE can represent the ratios the lowering needs."""
    inits = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(node.input) < 2:
            continue
        t = inits.get(node.input[1])
        if t is None or t.data_type not in FLOAT_TYPES:
            continue
        try:
            scale = numpy_helper.to_array(t).astype(np.float64)
        except (ValueError, TypeError):
            continue
        with np.errstate(all="ignore"):
            ok = np.isfinite(scale) & (scale >= MIN_SCALE) & (scale <= MAX_ABS_WEIGHT)
        if not ok.all():
            bad = scale[~ok].ravel()[0]
            raise UnsupportedOpError(node.name, node.op_type, f"scale {bad:.3g} is not a positive number in "
                                     f"[{MIN_SCALE:g}, {MAX_ABS_WEIGHT:g}]", where)


NO_TENSOR_TYPES = frozenset(getattr(TensorProto, t) for t in ("INT2", "UINT2", "INT4", "UINT4", "FLOAT4E2M1", "FLOAT8E8M0")
                            if hasattr(TensorProto, t))  # no numpy type: the quantiser fails (older onnx: no such type)


def check_value_types(model: onnx.ModelProto, where: str) -> None:
    """No tensor of a type npubuild cannot compute (2- and 4-bit integers, FLOAT4E2M1, FLOAT8E8M0: numpy has
    no type for them, so onnxruntime's quantiser and every check fail on them), named by the node making it.
    Run on the shape-inferred model: a Cast's output type is in its value_info."""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*model.graph.value_info, *model.graph.output]
             if vi.type.HasField("tensor_type")}
    for i, node in enumerate(model.graph.node):
        for out in node.output:
            if types.get(out) in NO_TENSOR_TYPES:
                name = TensorProto.DataType.Name(types[out])
                raise UnsupportedOpError(node.name or f"#{i}", node.op_type,
                                         f"makes a {name} tensor ('{out}'): npubuild computes no 2- or 4-bit "
                                         "integer, FLOAT4E2M1 or FLOAT8E8M0 tensor (numpy has no such type, so "
                                         "neither int8 quantisation nor the checks can hold it)", where)
