"""onnxruntime's static quantiser without its repeated and quadratic work, to the same QDQ model.

The per-model PTQ choice (ptq/choose.py) runs quantize_static once per candidate recipe, and the candidates
of one float model differ only in their activation ranges. Each run spent most of its time on work that
is the same in every candidate or quadratic in the model (ppocrv4_rec_48x160, five runs: issue 33,
/work/notes/issue-33-ptq-fast.md):

- rewiring each tensor's readers to its new DequantizeLinear by a Python loop over every input of every
  node (2.8 million replace_node_input calls): `replace_input_of_all_nodes` below visits only the nodes
  that read the tensor, the membership test in protobuf's C code;
- finding each initializer by a list of every initializer of that name: `find_by_name` stops at the first;
- the int8 scale and zero point of every weight channel (84 000 calls): `QuantiserCache.params` keeps
  them, keyed by the channel's bytes and every other argument, for the next candidate.

Each replacement does what onnxruntime's own function does (the same result for the same arguments), so
the model is byte-identical (tests/frontend/test_ort_quantiser.py; bench/ptq_speed.py over the real
models). An onnxruntime without these functions is left as it is.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# the modules of onnxruntime.quantization that call these functions by their own global name
FIND_BY_NAME_USERS = ("qdq_quantizer", "base_quantizer", "onnx_model")
QUANT_PARAMS_USERS = ("qdq_quantizer", "quant_utils")


@dataclass
class QuantiserCache:
    """What one quantize_static call of a per-model choice leaves for the next: onnxruntime's calibrations
    (files in `directory`: frontend/quantize.py) and weight channels' quantisation parameters."""

    directory: Path
    params: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


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


def _remembered(compute: Callable[..., tuple[np.ndarray, np.ndarray]],
                memo: dict[tuple, tuple[np.ndarray, np.ndarray]]) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """onnxruntime's compute_data_quant_params (a pure function of its arguments), computed once per distinct
    arguments: the data by dtype, shape and bytes. Copies are handed out, so no caller shares an array."""
    def compute_data_quant_params(data: np.ndarray, *args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        key = (data.dtype.str, data.shape, data.tobytes(), args, tuple(sorted(kwargs.items()))) \
            if isinstance(data, np.ndarray) else None
        try:
            hash(key)
        except TypeError:  # an argument that is no key: computed as it is
            key = None
        if key is None:
            return compute(data, *args, **kwargs)
        if key not in memo:
            memo[key] = compute(data, *args, **kwargs)
        zero_point, scale = memo[key]
        return zero_point.copy(), scale.copy()

    return compute_data_quant_params


def _patches(cache: QuantiserCache | None) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for every function above this onnxruntime has."""
    try:
        modules = {name: importlib.import_module(f"onnxruntime.quantization.{name}")
                   for name in {*FIND_BY_NAME_USERS, *QUANT_PARAMS_USERS}}
    except ImportError:
        return []
    patches: list[tuple[Any, str, Any]] = []
    if hasattr(getattr(modules["onnx_model"], "ONNXModel", None), "replace_input_of_all_nodes"):
        patches.append((modules["onnx_model"].ONNXModel, "replace_input_of_all_nodes", replace_input_of_all_nodes))
    patches += [(modules[n], "find_by_name", find_by_name) for n in FIND_BY_NAME_USERS
                if hasattr(modules[n], "find_by_name")]
    original = getattr(modules["quant_utils"], "compute_data_quant_params", None)
    if cache is not None and original is not None:
        remembered = _remembered(original, cache.params)
        patches += [(modules[n], "compute_data_quant_params", remembered) for n in QUANT_PARAMS_USERS
                    if getattr(modules[n], "compute_data_quant_params", None) is original]
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
