"""onnxruntime's static quantiser without its repeated and quadratic work, to the same QDQ model.

The per-model PTQ choice (ptq/choose.py) runs quantize_static once per candidate recipe, and the candidates
of one float model differ only in their activation ranges. Each run spent most of its time on work that
is the same in every candidate or quadratic in the model (ppocrv4_rec_48x160, five runs: issue 33,
/work/notes/issue-33-ptq-fast.md):

- rewiring each tensor's readers to its new DequantizeLinear by a Python loop over every input of every
  node (2.8 million replace_node_input calls): `replace_input_of_all_nodes` below visits only the nodes
  that read the tensor, the membership test in protobuf's C code;
- finding each initializer by a list of every initializer of that name: `find_by_name` stops at the first;
- the int8 scale and zero point of every weight channel (84 000 calls) and the int8 weights themselves,
  channel by channel: `QuantiserCache.results` keeps both functions' results, keyed by every argument
  (arrays and tensors by their bytes), for the next candidate;
- the whole QDQ rewrite, the same for every candidate of a model but for the values its activation ranges
  decide: `QuantiserCache.templates` keeps the first candidate's, and quantize_static's quantiser class is
  frontend/qdq_template.py's, which replays it for each further candidate;
- shape inference of the model file, run by every quantize_static call and by its calibrator on the same
  file: `load_model_with_shape_infer` keeps each file's inferred model (`QuantiserCache.inferred`, by its
  bytes) and hands out copies;
- the calibrator's graph with a ReduceMin and ReduceMax on each tensor, built by searching every node for
  each tensor's first reader and rebuilding the value-info table per tensor (quadratic: 1.4 s of
  ppocrv4_rec's): `augment_graph` finds each first reader once and places the nodes where onnxruntime's
  does, the outputs in its order;
- each per-channel weight's scales and zero points, and its int values, channel by channel in Python
  (~80 us a channel, 17 800 channels on ppocrv4_rec): frontend/weight_channels.py does all channels of a
  plain weight at once, to the same bits;
- the table of every tensor's readers, rebuilt by adjust_tensor_ranges for each Clip and Relu of a graph it
  does not change: `readers_once` builds it once a call.

Each replacement does what onnxruntime's own function does (the same result for the same arguments), so
the model is byte-identical (tests/frontend/test_ort_quantiser.py; bench/ptq_speed.py over the real
models). An onnxruntime without these functions is left as it is. The replacements hold only inside
`linear_quantiser()`'s block, in the process running it (the engine runs each stage task in a child of
its own: engine/isolate.py).
"""

from __future__ import annotations

import hashlib
import importlib
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import helper, numpy_helper

# the modules of onnxruntime.quantization that call these functions by their own global name
FIND_BY_NAME_USERS = ("qdq_quantizer", "base_quantizer", "onnx_model")
# the modules that call load_model_with_shape_infer by their own global name
SHAPE_INFER_USERS = ("quantize", "calibrate")
# pure functions of their arguments: name -> the modules that call it by their own global name
REMEMBERED = {"compute_data_quant_params": ("qdq_quantizer", "quant_utils"),
              "quantize_onnx_initializer": ("qdq_quantizer",)}


@dataclass
class QuantiserCache:
    """What one quantize_static call of a per-model choice leaves for the next: onnxruntime's calibrations
    (files in `directory`: frontend/quantize.py) and the REMEMBERED functions' results by their arguments."""

    directory: Path
    results: dict[tuple, Any] = field(default_factory=dict)
    templates: dict[str, Any] = field(default_factory=dict)  # frontend/qdq_template.py: structure key -> Template
    inferred: dict[str, Any] = field(default_factory=dict)  # model file's sha256 -> its shape-inferred ModelProto
    # whether the REMEMBERED functions keep and look up results now: not while a template is recorded or
    # replayed (its weights are quantised once per model, so keying every weight channel's bytes is all cost)
    remember: bool = True


def find_by_name(item_name: str, item_list: Iterable[Any]) -> Any:
    """onnxruntime's quant_utils.find_by_name (the first item of that name, or None), stopping at it."""
    for item in item_list:
        if item.name == item_name:
            return item
    return None


def replace_input_of_all_nodes(self, old_input_name: str, new_input_name: str) -> None:
    """onnxruntime's ONNXModel.replace_input_of_all_nodes, visiting only the nodes that read the tensor."""
    for node in self.model.graph.node:
        if old_input_name in node.input:
            self.replace_node_input(node, old_input_name, new_input_name)


def readers_once(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """onnxruntime's BaseQuantizer.adjust_tensor_ranges with the model's reader table built once per call, not
    once per Clip and Relu (150 tables of every node on ppocrv4_rec): the method reads the graph and writes only
    the quantiser's tensors_range, and reads the table without changing it, so every table it builds is the
    same."""

    def adjust_tensor_ranges(self) -> Any:
        model = self.model
        if "input_name_to_nodes" in vars(model):  # someone else's stand-in: leave it
            return original(self)
        table: dict[str, list[Any]] | None = None

        def input_name_to_nodes() -> dict[str, list[Any]]:
            nonlocal table
            if table is None:
                table = type(model).input_name_to_nodes(model)
            return table

        model.input_name_to_nodes = input_name_to_nodes
        try:
            return original(self)
        finally:
            del model.input_name_to_nodes

    return adjust_tensor_ranges


def _inferred(original: Callable[[Path], Any], cache: QuantiserCache) -> Callable[[Path], Any]:
    """onnxruntime's load_model_with_shape_infer(model_path), its result kept per file content: shape inference
    reads nothing but the file, unless the model keeps tensors in external files (whose entries always name
    a "location": such a file is inferred afresh)."""

    def load_model_with_shape_infer(model_path: Path) -> Any:
        data = Path(model_path).read_bytes()
        if b"location" in data:
            return original(model_path)
        key = hashlib.sha256(data).hexdigest()
        if key not in cache.inferred:
            cache.inferred[key] = original(model_path)
        return _copy(cache.inferred[key])

    return load_model_with_shape_infer


def augment_graph(self) -> None:
    """onnxruntime's MinMaxCalibrater.augment_graph: a ReduceMin and a ReduceMax (each reshaped to 1-D) on every
    tensor to calibrate, each pair inserted before the tensor's first reader (ReduceMax first: onnxruntime
    inserts it before the ReduceMin, now that tensor's first reader) or at the end, and their outputs added
    to the graph's in onnxruntime's order; each first reader found once, not by a search per tensor."""
    model = self.model
    tensors, _ = self.select_tensors_to_calibrate(model)
    reshape_shape_name = str(uuid.uuid4())
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), reshape_shape_name))
    value_infos = {vi.name: vi for vi in model.graph.value_info}
    value_infos.update({o.name: o for o in model.graph.output})
    inputs = {i.name: i for i in model.graph.input}
    value_infos.update(inputs)
    first_reader: dict[str, int] = {}
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            first_reader.setdefault(name, index)
    before: dict[int, list[Any]] = {}  # original node index -> the nodes inserted before it, in order
    at_end: list[Any] = []
    for tensor in tensors:
        group: list[Any] = []
        for op in ("ReduceMin", "ReduceMax"):
            group[:0] = _reduce_nodes(self, tensor, op, reshape_shape_name, value_infos)  # the later before
        if tensor in first_reader:
            before.setdefault(first_reader[tensor], []).extend(group)
        else:
            at_end.extend(group)
        for op in ("ReduceMin", "ReduceMax"):  # onnxruntime reads each type from the outputs so far, inputs first
            output = helper.make_tensor_value_info(f"{tensor}_{op}", value_infos[tensor].type.tensor_type.elem_type,
                                                   [None])
            model.graph.output.append(output)
            if output.name not in inputs:
                value_infos[output.name] = output
    nodes = []
    for index, node in enumerate(model.graph.node):
        nodes += before.get(index, [])
        nodes.append(node)
    nodes += at_end
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, self.augmented_model_path, save_as_external_data=self.use_external_data_format)


def _reduce_nodes(self, tensor: str, op: str, reshape_shape_name: str, value_infos: dict[str, Any]) -> list[Any]:
    """One tensor's `op` (ReduceMin or ReduceMax) and Reshape nodes, as onnxruntime's add_reduce_min_max makes them
    (per-channel axes as an attribute or an initializer by the opset)."""
    if tensor not in value_infos:
        raise ValueError(f"Unable to guess tensor type for tensor {tensor!r}, running shape inference before "
                         "quantization may resolve this issue.")
    reduce_output = f"{tensor}_{op}"
    intermediate_output = reduce_output + "_Reshape"
    reduce_node = helper.make_node(op, [tensor], [intermediate_output], keepdims=1, name=reduce_output)
    reshape_node = helper.make_node("Reshape", inputs=[intermediate_output, reshape_shape_name],
                                    outputs=[reduce_output], name=intermediate_output)
    if self.per_channel:
        rank = len(value_infos[tensor].type.tensor_type.shape.dim)
        axes = [0, *range(2, rank)]
        if _op_version(op, self.model) < 18:
            reduce_node.attribute.append(helper.make_attribute("axes", axes))
        else:
            axes_name = str(uuid.uuid4())
            reduce_node.input.append(axes_name)
            self.model.graph.initializer.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name))
    return [reduce_node, reshape_node]


def _op_version(op_type: str, model: Any) -> int:
    for opset_import in model.opset_import:
        if onnx.defs.has(op_type, opset_import.domain):
            return opset_import.version
    raise RuntimeError(f"Model does not contain a version for '{op_type}'.")


def _key(value: Any) -> Any:
    """A hashable stand-in for an argument that equals another's only for the same value of the same type: an
    array or number by dtype, shape and bytes (0.0 and -0.0 differ, True is not 1), a protobuf by its bytes."""
    if isinstance(value, np.ndarray | np.generic | float | bool):
        array = np.asarray(value)
        return type(value).__name__, array.dtype.str, array.shape, array.tobytes()
    if isinstance(value, Message):
        return type(value).__name__, value.SerializeToString(deterministic=True)
    if isinstance(value, list | tuple):
        return type(value).__name__, tuple(_key(v) for v in value)
    return value


def _copy(value: Any) -> Any:
    """A result as fresh as the function's own: no caller shares an array or a tensor with another."""
    if isinstance(value, np.ndarray | np.generic):
        return value.copy()
    if isinstance(value, Message):
        fresh = type(value)()
        fresh.CopyFrom(value)
        return fresh
    if isinstance(value, list | tuple):
        return type(value)(_copy(v) for v in value)
    return value


def _remembered(name: str, compute: Callable[..., Any], cache: QuantiserCache) -> Callable[..., Any]:
    """`compute` (a pure function of its arguments) run once per distinct arguments as given (positional and
    keyword apart: onnxruntime calls each from fixed call sites, and a miss only computes); a copy of its
    result handed out each time. Arguments that give no key (an unhashable value) are computed as they are,
    and so is every call while `cache.remember` is off."""
    memo = cache.results

    def remembered(*args: Any, **kwargs: Any) -> Any:
        if not cache.remember:
            return compute(*args, **kwargs)
        key = (name, tuple(_key(v) for v in args), tuple((k, _key(v)) for k, v in sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:
            return compute(*args, **kwargs)
        if key not in memo:
            memo[key] = compute(*args, **kwargs)
        return _copy(memo[key])

    return remembered


def _patches(cache: QuantiserCache | None) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for every function above this onnxruntime has."""
    try:
        modules = {name: importlib.import_module(f"onnxruntime.quantization.{name}")
                   for name in {*FIND_BY_NAME_USERS, *(n for users in REMEMBERED.values() for n in users),
                                *SHAPE_INFER_USERS}}
    except ImportError:
        return []
    patches: list[tuple[Any, str, Any]] = []
    if hasattr(getattr(modules["onnx_model"], "ONNXModel", None), "replace_input_of_all_nodes"):
        patches.append((modules["onnx_model"].ONNXModel, "replace_input_of_all_nodes", replace_input_of_all_nodes))
    patches += [(modules[n], "find_by_name", find_by_name) for n in FIND_BY_NAME_USERS
                if hasattr(modules[n], "find_by_name")]
    base = getattr(modules["base_quantizer"], "BaseQuantizer", None)
    if hasattr(base, "adjust_tensor_ranges") and hasattr(getattr(modules["onnx_model"], "ONNXModel", None),
                                                         "input_name_to_nodes"):
        patches.append((base, "adjust_tensor_ranges", readers_once(base.adjust_tensor_ranges)))
    calibrater = getattr(modules["calibrate"], "MinMaxCalibrater", None)
    if all(hasattr(calibrater, a) for a in ("augment_graph", "select_tensors_to_calibrate")):
        patches.append((calibrater, "augment_graph", augment_graph))
    original = getattr(modules["quant_utils"], "load_model_with_shape_infer", None)
    if cache is not None and original is not None:
        inferred = _inferred(original, cache)
        patches += [(modules[n], "load_model_with_shape_infer", inferred) for n in SHAPE_INFER_USERS
                    if getattr(modules[n], "load_model_with_shape_infer", None) is original]
    if cache is not None and hasattr(modules["quantize"], "QDQQuantizer"):  # each candidate from the first one's
        try:
            from npubuild.frontend.qdq_template import template_quantizer
        except ImportError:  # an onnxruntime without the quantiser parts it records
            template_quantizer = None
        if template_quantizer is not None:
            patches.append((modules["quantize"], "QDQQuantizer", template_quantizer(cache)))
    fast = _fast_weight_channels(modules, patches)
    for name, users in REMEMBERED.items():
        original = getattr(modules["quant_utils"], name, None)
        if original is None:
            continue
        compute = fast.get(name, original)
        if cache is not None:
            compute = _remembered(name, compute, cache)
        if compute is not original:
            patches += [(modules[n], name, compute) for n in users if getattr(modules[n], name, None) is original]
    return patches


def _fast_weight_channels(modules: dict[str, Any], patches: list[tuple[Any, str, Any]]) -> dict[str, Any]:
    """frontend/weight_channels.py's per-channel weight parameters (a QDQQuantizer method, added to `patches`)
    and int values (returned by name, for the REMEMBERED loop to wrap), where this onnxruntime has both."""
    quantizer = getattr(modules["qdq_quantizer"], "QDQQuantizer", None)
    initializer = getattr(modules["quant_utils"], "quantize_onnx_initializer", None)
    if not hasattr(quantizer, "_calc_initializer_quant_params") or initializer is None:
        return {}
    try:
        from npubuild.frontend import weight_channels
    except ImportError:  # an onnxruntime without the names it reads
        return {}
    patches.append((quantizer, "_calc_initializer_quant_params",
                    weight_channels.fast_initializer_quant_params(quantizer._calc_initializer_quant_params)))
    if hasattr(quantizer, "_adjust_weight_scale_for_int32_bias"):
        patches.append((quantizer, "_adjust_weight_scale_for_int32_bias",
                        weight_channels.fast_bias_scale_adjust(quantizer._adjust_weight_scale_for_int32_bias)))
    return {"quantize_onnx_initializer": weight_channels.fast_quantize_onnx_initializer(initializer)}


@contextmanager
def linear_quantiser(cache: QuantiserCache | None = None) -> Iterator[None]:
    """onnxruntime's quantiser, within the block, with the functions above in place of its own (the weight
    parameters remembered in `cache` when one is given)."""
    patches = _patches(cache)
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    try:
        for owner, attr, new in patches:
            setattr(owner, attr, new)
        yield
    finally:
        for owner, attr, old in originals:
            setattr(owner, attr, old)
