"""A further PTQ candidate's QDQ model from the first one's, by swapping only what its activation ranges decide.

The per-model PTQ choice (ptq/choose.py) quantises one float model once per range estimator, and the
candidates differ only in their TensorQuantOverrides values (each activation's rmin/rmax). Everything else
onnxruntime's QDQQuantizer.quantize_model does (which ops get Q/DQ pairs, the Relu/Clip removal, the
shared-parameter tensors, the weights, the initializer order, the names) is decided by the model, the
options and which tensors have overrides, not by their values (issue 33). The values reach the output only
through the quantiser's `quantization_params` (calc_graph_quant_params, run by its constructor from the
calibration ranges and the overrides), and from there only:

- each activation's scale and zero-point initializers (`_make_tensor_scale_zp_initializers`);
- the weight-scale adjustment for a bias whose scale would be too small for int32
  (`_adjust_weight_quant_params_for_bias_tensors`: a weight channel with tiny values and a large bias, as
  a folded BatchNorm leaves, in every candidate of ppocrv4_rec and _det), which changes that weight's scale
  initializer and its int8 values (`_add_qdq_nodes_for_initializer`);
- each int32 bias, its scale and zero point (`quantize_bias_static`: input scale x weight scale).

So the first quantize_model of a structure (its key: the quantiser's input model, options, op types and
override structure) runs in full and records its output and what it computed those from (a `Template`);
each later one with the same key builds its quantiser as onnxruntime does (the same constructor computes
its quantization_params), runs those steps again with onnxruntime's own methods on a stand-in holding only
what they read, and writes their initializers over the template's of the same names. Where a step's
inputs are not the plain ones recorded (a converted type, a float16 bias, a pre-quantised input, a name
made twice or already in the model), that structure gets no template and every candidate runs in full.

The equalised candidate's model (ptq/equalize.py) is the same graph with other values in some weights and
biases. A template also serves a model that differs from its own only in the values of the initializers it
recomputes (its `values`: the quantised weights and the biases; the key with those blanked): the changed
weights' parameters come from onnxruntime's _calc_initializer_quant_params, then the same steps as above.
That is only done where nothing else in the quantiser reads those values (no Pad's constant among them,
none left in the output).

tests/frontend/test_qdq_template.py and bench/ptq_speed.py --check-templates compare every replayed
candidate with a full run, byte for byte.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import onnx
from onnxruntime.quantization import qdq_quantizer
from onnxruntime.quantization.onnx_model import ONNXModel
from onnxruntime.quantization.qdq_quantizer import QDQBiasQuantInfo, QDQQuantizer, QDQTensorQuantizedValue

# the QDQQuantizer methods a template records and replays: without any of them there is no template
REPLAYED = ("_make_tensor_scale_zp_initializers", "_make_scale_zp_initializers", "_adjust_weight_scale_for_int32_bias",
            "_adjust_weight_quant_params_for_bias_tensors", "quantize_bias_static", "calc_graph_quant_params",
            "_add_qdq_nodes_for_initializer", "_calc_initializer_quant_params", "_dup_initializer")
if not all(hasattr(QDQQuantizer, m) for m in REPLAYED) or not hasattr(qdq_quantizer, "quantize_onnx_initializer"):
    raise ImportError("this onnxruntime's QDQQuantizer lacks a method a template replays")
OVERRIDE_KEYS = frozenset({"rmin", "rmax"})  # the overrides a template covers: range values only
SCALAR_OPTION = (bool, int, float, str)


@dataclass
class BiasRecord:
    """One int32 bias as the template's quantize_bias_static saw it: what it reads but the scales and values."""

    name: str
    info: QDQBiasQuantInfo
    weight: QDQTensorQuantizedValue
    input: QDQTensorQuantizedValue
    created: tuple[str, ...]  # the initializers it made: the int32 bias, its scale, its zero point


@dataclass
class WeightRecord:
    """One initializer quantised by _add_qdq_nodes_for_initializer: the float tensor and the names it made."""

    float_weight: onnx.TensorProto
    created: tuple[str, str, str]  # the int8 tensor, its scale, its zero point


@dataclass
class AdjustState:
    """What _adjust_weight_quant_params_for_bias_tensors read in the template run, to run it again, and the
    weights' parameters it left (what the template's int8 weights were made with)."""

    bias_to_quantize: dict[str, QDQBiasQuantInfo]
    tensors_to_quantize: dict[str, Any]
    initializer_quant_params: dict[str, Any]  # before the adjustment
    biases: dict[str, onnx.TensorProto]  # each bias to quantise, as a float tensor
    adjusted: dict[str, Any] = field(default_factory=dict)  # after it


@dataclass
class Template:
    """The full quantize_model output of one structure (before quantize_static's sort and save) and its records."""

    model: onnx.ModelProto
    activations: list[tuple[str, str, str]]  # tensor, its scale initializer, its zero-point initializer
    weights: dict[str, WeightRecord]
    biases: list[BiasRecord]
    adjust: AdjustState
    sources: dict[str, str]  # each quantised bias -> the input model's initializer it holds (a copy's source)
    values: frozenset[str] = frozenset()  # the input model's initializers whose values the replay recomputes
    value_key: str | None = None  # structure_key with `values` blanked: a model alike but for those values


@dataclass
class _Recording:
    activations: list[tuple[str, str, str]] = field(default_factory=list)
    weights: dict[str, WeightRecord] = field(default_factory=dict)
    biases: list[BiasRecord] = field(default_factory=list)
    adjust: AdjustState | None = None
    copies: dict[str, str] = field(default_factory=dict)  # a bias copied for a second reader -> its source
    usable: bool = True


def structure_key(q: QDQQuantizer, blank: frozenset[str] = frozenset()) -> str | None:
    """Everything quantize_model reads but the range values (and the values of the initializers named in
    `blank`), hashed; None when the quantiser's options are not the plain ones this reproduces (no range
    overrides, an override of anything but rmin/rmax, or of a weight)."""
    overrides = q.extra_options.get("TensorQuantOverrides")
    if not overrides or not isinstance(overrides, dict):
        return None
    structure = []
    for name, entries in overrides.items():
        if name in q.initializers or not isinstance(entries, list) or len(entries) != 1 \
                or not isinstance(entries[0], dict) or not set(entries[0]) <= OVERRIDE_KEYS:
            return None
        structure.append((name, tuple(sorted(entries[0]))))
    options = {k: v for k, v in q.extra_options.items() if k != "TensorQuantOverrides"}
    if not all(isinstance(v, SCALAR_OPTION) for v in options.values()) or q.tensors_range is None \
            or q.add_qdq_pair_to_weight or q.block_size:
        return None
    model = q.model.model
    if blank:
        model = _blanked(model, blank)
    digest = hashlib.sha256(model.SerializeToString(deterministic=True))
    digest.update(repr((q.per_channel, q.reduce_range, q.weight_qType, q.activation_qType, q.nodes_to_quantize,
                        q.nodes_to_exclude, q.op_types_to_quantize, sorted(options.items()), structure,
                        list(q.tensors_range.keys()))).encode())
    return digest.hexdigest()


def _blanked(model: onnx.ModelProto, names: frozenset[str]) -> onnx.ModelProto:
    """A copy of `model` whose initializers in `names` keep their name, type and shape but not their values."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.name in names:
            t.CopyFrom(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
    return out


def _proto(tensor: onnx.TensorProto, name: str | None = None) -> onnx.TensorProto:
    fresh = onnx.TensorProto()
    fresh.CopyFrom(tensor)
    if name is not None:
        fresh.name = name
    return fresh


def _scratch(initializers: list[onnx.TensorProto]) -> ONNXModel:
    """An ONNXModel holding only `initializers`: what the replayed methods look up and add to."""
    model = onnx.ModelProto()
    model.graph.initializer.extend(initializers)
    return ONNXModel(model)


class TemplateQuantizer(QDQQuantizer):
    """onnxruntime's QDQQuantizer whose quantize_model records a template (the first of a structure) or replays one.

    `cache.templates` (structure key -> Template, or None for a structure a template cannot serve) is what the
    candidates of one per-model choice share (ort_quantiser.QuantiserCache). While a template is recorded or
    replayed, `cache.remember` is off: each weight is then quantised once per model (or only where its values
    changed), so ort_quantiser's remembered functions would only key every weight channel's bytes (rec: 2.4
    of 31 CPU s); they stay on for the full runs of a structure without a template. `check` (bench and
    tests) runs the full quantize_model after each replay too and raises unless the two are the same bytes."""

    check: ClassVar[bool] = False
    checked: ClassVar[int] = 0  # replays compared with a full run (check on)
    replayed: ClassVar[int] = 0  # quantize_model calls served from a template, in this process

    def __init__(self, *args: Any, cache: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cache = cache
        self.templates: dict[str, Template | None] = cache.templates
        self._recording: _Recording | None = None

    # ---- onnxruntime's methods, recorded in the template run

    def _make_tensor_scale_zp_initializers(self, tensor_name):
        inits = super()._make_tensor_scale_zp_initializers(tensor_name)
        rec = self._recording
        if rec is not None:
            if inits is None or inits.converted is not None:
                rec.usable = False
            else:
                rec.activations.append((tensor_name, inits.original.scale.name, inits.original.zero_point.name))
        return inits

    def _adjust_weight_quant_params_for_bias_tensors(self):
        rec = self._recording
        if rec is not None:
            biases = {name: _proto(b) for name in self.bias_to_quantize if (b := _find(self.model, name)) is not None}
            rec.adjust = AdjustState(dict(self.bias_to_quantize), copy.deepcopy(self.tensors_to_quantize),
                                     copy.deepcopy(self.initializer_quant_params), biases)
        super()._adjust_weight_quant_params_for_bias_tensors()
        if rec is not None and rec.adjust is not None:
            rec.adjust.adjusted = copy.deepcopy(self.initializer_quant_params)

    def _dup_initializer(self, initializer):
        copied = super()._dup_initializer(initializer)
        if self._recording is not None:
            self._recording.copies[copied.name] = self._recording.copies.get(initializer.name, initializer.name)
        return copied

    def _add_qdq_nodes_for_initializer(self, weight_proto):
        rec = self._recording
        if rec is None or weight_proto.name in self.quantized_value_map:
            return super()._add_qdq_nodes_for_initializer(weight_proto)
        float_weight = _proto(weight_proto)
        before = {t.name for t in self.model.initializer()}
        super()._add_qdq_nodes_for_initializer(weight_proto)
        value = self.quantized_value_map[float_weight.name].original
        created = (value.q_name, value.scale_name, value.zp_name)
        if before & set(created):
            rec.usable = False
        else:
            rec.weights[float_weight.name] = WeightRecord(float_weight, created)

    def quantize_bias_static(self, bias_name, bias_info):
        rec = self._recording
        if rec is None:
            return super().quantize_bias_static(bias_name, bias_info)
        bias = _find(self.model, bias_name)
        weight = self.quantized_value_map.get(bias_info.weight_name)
        source = self.quantized_value_map.get(bias_info.input_name)
        before = {t.name for t in self.model.initializer()}
        name = super().quantize_bias_static(bias_name, bias_info)
        value = self.quantized_value_map[bias_name].original
        created = (value.q_name, value.scale_name, value.zp_name)
        if bias is None or weight is None or source is None or bias.data_type != onnx.TensorProto.FLOAT \
                or value.node_type not in (None, "DequantizeLinear") or before & set(created):
            rec.usable = False  # not the plain float32 bias of a quantised weight and input this replays
        else:
            rec.biases.append(BiasRecord(bias_name, bias_info, weight, source, created))
        return name

    # ---- the whole model

    def quantize_model(self):
        key = structure_key(self)
        if key is None:
            return super().quantize_model()
        source = None
        if key in self.templates:
            template = self.templates[key]
        else:  # a template of the same graph with other weights (the equalised model): its values recomputed
            template = next((t for t in self.templates.values() if t is not None and t.value_key is not None
                             and structure_key(self, t.values) == t.value_key), None)
            if template is None:
                return self._record(key)
            source = self.model
        replayed = self._unremembered(self.replay, template, source) if template is not None else None
        if replayed is None:  # a step made other names than the template's: the full run
            return super().quantize_model()
        if self.check:
            full = super().quantize_model()
            if full.SerializeToString(deterministic=True) != replayed.SerializeToString(deterministic=True):
                raise AssertionError("the replayed QDQ model differs from onnxruntime's full quantisation")
            TemplateQuantizer.checked += 1
        TemplateQuantizer.replayed += 1
        self.model = ONNXModel(replayed)
        return replayed

    def _record(self, key: str) -> onnx.ModelProto:
        inputs = set(self.initializers)
        before = onnx.ModelProto()
        before.CopyFrom(self.model.model)
        self._recording = rec = _Recording()
        try:
            model = self._unremembered(super().quantize_model)
        finally:
            self._recording = None
        names = [n for a in rec.activations for n in a[1:]] + [n for b in rec.biases for n in b.created] \
            + [n for w in rec.weights.values() for n in w.created]
        usable = rec.usable and rec.adjust is not None and len(set(names)) == len(names) \
            and not inputs & set(names)
        snapshot = onnx.ModelProto()
        snapshot.CopyFrom(model)  # before quantize_static's topological sort, which the replay's save repeats
        if not usable:
            self.templates[key] = None
            return model
        sources = {b: rec.copies.get(b, b) for b in rec.adjust.bias_to_quantize}
        values = frozenset(rec.weights) | frozenset(sources.values())
        template = Template(snapshot, rec.activations, rec.weights, rec.biases, rec.adjust, sources, values)
        # a model alike but for these values is served only where nothing else reads them: no Pad's constant
        # (QDQPad reads it) and none of them left in the output as they were (each is quantised or removed)
        if values <= inputs and not any(n.op_type == "Pad" and len(n.input) > 2 and n.input[2] in values
                                        for n in before.graph.node) \
                and not any(t.name in values for t in snapshot.graph.initializer):
            template.value_key = structure_key(_WithModel(self, before), values)
        self.templates[key] = template
        return model

    def _unremembered(self, run: Callable[..., Any], *args: Any) -> Any:
        remember, self.cache.remember = self.cache.remember, False
        try:
            return run(*args)
        finally:
            self.cache.remember = remember

    def replay(self, template: Template, source: ONNXModel | None = None) -> onnx.ModelProto | None:
        """This quantiser's output from `template`: its activation initializers, adjusted weights and int32
        biases recomputed by onnxruntime's methods from this quantiser's quantization_params, on a stand-in copy
        of it; with `source` (this quantiser's input model, alike but for the template's `values`), its weights'
        and biases' values too. None if a step makes other names than the template's (then the full run)."""
        stand_in = copy.copy(self)  # shares quantization_params (read only); its own model and maps below
        stand_in._recording = None
        new: dict[str, onnx.TensorProto] = {}
        adjust = template.adjust
        floats = {w: r.float_weight for w, r in template.weights.items()}
        biases = dict(adjust.biases)
        if set(biases) != set(adjust.bias_to_quantize):
            return None
        params = copy.deepcopy(adjust.initializer_quant_params)
        changed: set[str] = set()
        if source is not None:
            mine = {t.name: t for t in source.initializer() if t.name in template.values}
            changed = {w for w in floats if mine[w].SerializeToString() != floats[w].SerializeToString()}
            floats.update((w, mine[w]) for w in changed)
            biases = {b: _proto(mine[template.sources[b]], b) for b in adjust.bias_to_quantize}
            if changed:  # their parameters as _calc_initializer_quant_params makes them
                stand_in.tensors_to_quantize = {w: adjust.tensors_to_quantize[w] for w in adjust.tensors_to_quantize
                                                if w in changed}
                stand_in.model = _scratch([_proto(floats[w]) for w in stand_in.tensors_to_quantize])
                params.update(stand_in._calc_initializer_quant_params())

        stand_in.model = _scratch([])
        for tensor, scale_name, zp_name in template.activations:
            inits = stand_in._make_tensor_scale_zp_initializers(tensor)
            if inits is None or inits.converted is not None \
                    or (inits.original.scale.name, inits.original.zero_point.name) != (scale_name, zp_name):
                return None
            new[scale_name], new[zp_name] = inits.original.scale, inits.original.zero_point

        stand_in.bias_to_quantize = adjust.bias_to_quantize
        stand_in.tensors_to_quantize = adjust.tensors_to_quantize
        stand_in.initializer_quant_params = params
        stand_in.model = _scratch([_proto(biases[b]) for b in adjust.bias_to_quantize])
        stand_in._adjust_weight_quant_params_for_bias_tensors()
        for name, weight_params in params.items():
            if name not in changed and _same_params(weight_params, adjust.adjusted.get(name)):
                continue  # the template's int8 weight, scale and zero point are this candidate's
            weight = template.weights.get(name)
            if weight is None:
                return None
            made = _weight_initializers(stand_in, floats[name], weight_params)
            if tuple(t.name for t in made) != weight.created:
                return None
            new.update((t.name, t) for t in made)

        out = onnx.ModelProto()
        out.CopyFrom(template.model)
        kept = {t.name: t for t in out.graph.initializer}
        for b in template.biases:
            names = (b.weight.get_for_consumer(b.info.node_name).scale_name,
                     b.input.get_for_consumer(b.info.node_name).scale_name)
            scales = [new[n] if n in new else kept.get(n) for n in names]
            if any(s is None for s in scales):
                return None
            stand_in.model = _scratch([_proto(biases[b.name]), *(_proto(s) for s in scales)])
            stand_in.quantized_value_map = {b.info.weight_name: b.weight, b.info.input_name: b.input}
            stand_in.quantize_bias_static(b.name, b.info)
            made = list(stand_in.model.initializer())[1 + len(scales):]
            if tuple(t.name for t in made) != b.created:
                return None
            new.update((t.name, t) for t in made)

        for t in out.graph.initializer:
            if t.name in new:
                t.CopyFrom(new[t.name])
        return out


class _WithModel:
    """What structure_key reads of a quantiser, with another input model (the template's, before it ran)."""

    def __init__(self, q: QDQQuantizer, model: onnx.ModelProto):
        self.__dict__.update(q.__dict__)
        self.model = ONNXModel(model)


def _same_params(a: Any, b: Any) -> bool:
    """Two weights' QuantizationParams equal in every value, dtype and shape (so they quantise alike)."""
    if a is None or b is None or set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _weight_initializers(stand_in: TemplateQuantizer, weight: onnx.TensorProto, params: Any) -> list[onnx.TensorProto]:
    """What _add_qdq_nodes_for_initializer makes for `weight` with `params`: its int8 tensor, scale and zero point
    (onnxruntime's quantize_onnx_initializer and _make_scale_zp_initializers, as that method calls them)."""
    stand_in.model = _scratch([])
    inits = stand_in._make_scale_zp_initializers(weight.name, params)
    quantised = qdq_quantizer.quantize_onnx_initializer(weight, params["quant_type"], params["zero_point"],
                                                        params["scale"], params.get("axis"),
                                                        block_size=params.get("block_size", 0))
    return [quantised, inits.scale, inits.zero_point]


def _find(model: ONNXModel, name: str) -> onnx.TensorProto | None:
    return next((t for t in model.initializer() if t.name == name), None)


def template_quantizer(cache: Any) -> Callable[..., TemplateQuantizer]:
    """A stand-in for onnxruntime's QDQQuantizer class (as quantize_static calls it) sharing `cache` (an
    ort_quantiser.QuantiserCache: its `templates`, and its `remember` switch for the remembered functions)."""
    def make(*args: Any, **kwargs: Any) -> TemplateQuantizer:
        return TemplateQuantizer(*args, cache=cache, **kwargs)

    return make
