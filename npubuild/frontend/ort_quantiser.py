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
  frontend/qdq_template.py's, which replays it for each further candidate.

Each replacement does what onnxruntime's own function does (the same result for the same arguments), so
the model is byte-identical (tests/frontend/test_ort_quantiser.py; bench/ptq_speed.py over the real
models). An onnxruntime without these functions is left as it is. The replacements hold only inside
`linear_quantiser()`'s block, in the process running it (the engine runs each stage task in a child of
its own: engine/isolate.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.message import Message

# the modules of onnxruntime.quantization that call these functions by their own global name
FIND_BY_NAME_USERS = ("qdq_quantizer", "base_quantizer", "onnx_model")
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
                   for name in {*FIND_BY_NAME_USERS, *(n for users in REMEMBERED.values() for n in users), "quantize"}}
    except ImportError:
        return []
    patches: list[tuple[Any, str, Any]] = []
    if hasattr(getattr(modules["onnx_model"], "ONNXModel", None), "replace_input_of_all_nodes"):
        patches.append((modules["onnx_model"].ONNXModel, "replace_input_of_all_nodes", replace_input_of_all_nodes))
    patches += [(modules[n], "find_by_name", find_by_name) for n in FIND_BY_NAME_USERS
                if hasattr(modules[n], "find_by_name")]
    if cache is not None and hasattr(modules["quantize"], "QDQQuantizer"):  # each candidate from the first one's
        try:
            from npubuild.frontend.qdq_template import template_quantizer
        except ImportError:  # an onnxruntime without the quantiser parts it records
            template_quantizer = None
        if template_quantizer is not None:
            patches.append((modules["quantize"], "QDQQuantizer", template_quantizer(cache)))
    for name, users in REMEMBERED.items():
        original = getattr(modules["quant_utils"], name, None)
        if cache is not None and original is not None:
            remembered = _remembered(name, original, cache)
            patches += [(modules[n], name, remembered) for n in users if getattr(modules[n], name, None) is original]
    return patches


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
