"""quantize stage: onnxruntime static quantisation to a QDQ int8 model.

A model onnxruntime cannot quantise is bad input (exit 2) wherever the cause can be named: a node
onnxruntime cannot run on the calibration data (its message names it), a node whose output overflows
float32 on that data (found by running the model with every output exposed, on the failure path only),
or a model onnxruntime cannot load; anything else is a stage failure (exit 1). Each is one line.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime import quantization as ortq

from npubuild.config.schema import Calibration, Quantization
from npubuild.errors import InputError, NpubuildError, StageError, is_out_of_memory, one_line
from npubuild.fileio import write_bytes
from npubuild.frontend.calibration import entropy_options
from npubuild.frontend.data import calibration_arrays, graph_inputs
from npubuild.frontend.ort_quantiser import QuantiserCache, linear_quantiser
from npubuild.frontend.passes import HOST_REASON
from npubuild.frontend.ptq.choose import Choice, Scorer, choose
from npubuild.frontend.qdq_add_ratio import snap_if_free
from npubuild.frontend.qdq_concat import share_concat_scales
from npubuild.frontend.qdq_feedback import check_feedback, tie_feedback
from npubuild.frontend.qdq_linear import fold_linear_bias
from npubuild.frontend.qoperator import is_quantized
from npubuild.frontend.quantized_ops import quantized_op_types
from npubuild.frontend.samples import SampleSource

MAX_CALIBRATION_BYTES = 1 << 30  # random calibration arrays held in memory at once
MAX_QUANTIZE_NODES = 2500  # onnxruntime's quantiser is quadratic in the node count (bench/hardening.md)
ORT_NODE_FAILURE = re.compile(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", re.S)
ORT_NOISE = [re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : "),
             re.compile(r"/onnxruntime_src/\S+:\d+ (?:[^()]*\([^()]*\)(?: const)? )?")]
OVERFLOW = 1e30

METHODS = {
    "minmax": ortq.CalibrationMethod.MinMax,
    "entropy": ortq.CalibrationMethod.Entropy,
    "percentile": ortq.CalibrationMethod.Percentile,
}


class ArrayReader(ortq.CalibrationDataReader):
    """Feeds one sample at a time from per-input arrays of shape (N, ...)."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays
        self.n = next(iter(arrays.values())).shape[0]
        self.i = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= self.n:
            return None
        sample = {k: np.asarray(v[self.i]) for k, v in self.arrays.items()}  # a rank-0 input: an array too
        self.i += 1
        return sample

    def rewind(self) -> None:
        self.i = 0


def quantize(float_model: Path, arrays: dict[str, np.ndarray], q: dict,
             cache: QuantiserCache | None = None) -> onnx.ModelProto:
    """The float model quantised to QDQ int8 by onnxruntime. Where onnxruntime's quantiser fails on one op type
    (a Gemm with a matrix bias, a LayerNormalization over several axes), that op type is left in float and
    everything around it quantised: those nodes then run on the host. `cache`: what an earlier candidate of
    the same per-model choice left (frontend/ort_quantiser.py, _calibration_cache)."""
    source = onnx.load(str(float_model))
    model = vector_gemm_biases(source)
    with tempfile.TemporaryDirectory(prefix="npubuild-quant-") as tmp:
        # onnxruntime's calibrator writes `<model>-inferred.onnx` beside the model it is given: given the import
        # stage's model.onnx it wrote into that stage's dir (on a full disk a truncated file, which it then
        # failed to parse); so it is given a link in its own temp dir
        path = Path(tmp) / "float.onnx"
        if model is not source:
            onnx.save(model, path)
        else:
            path.symlink_to(Path(float_model).resolve())
        out = Path(tmp) / "qdq.onnx"
        logging.getLogger().setLevel(logging.ERROR)
        op_types = quantized_op_types()
        try:
            _quantize_static(path, out, arrays, q, op_types, cache)
        except Exception as exc:
            if is_out_of_memory(exc):
                raise MemoryError from None
            if not _without_one_op_type(model, path, out, arrays, q, op_types, cache):
                raise quantisation_error(exc, float_model, arrays) from None
        qdq = onnx.load(str(out))
        if _uncalibrated(qdq, q):  # a tensor the statistics did not see: calibrate it on every sample
            _quantize_static(path, out, arrays, {**q, "_all_samples": True}, op_types, cache)
            qdq = onnx.load(str(out))
    _check_scales(qdq)
    fold_linear_bias(qdq, model)  # MatMul + bias Add as one layer, as TFLite's FullyConnected
    _keep_host_reasons(model, qdq)
    return qdq


def _keep_host_reasons(float_model: onnx.ModelProto, qdq: onnx.ModelProto) -> None:
    """The import's note on a node it left to the host (why an If stays whole: frontend/passes/control_flow.py)
    put back on the QDQ model's node of that name: onnxruntime's quantiser drops doc strings."""
    notes = {n.name: n.doc_string for n in float_model.graph.node if n.name and n.doc_string.startswith(HOST_REASON)}
    for n in qdq.graph.node:
        if n.name in notes and not n.doc_string:
            n.doc_string = notes[n.name]


def _uncalibrated(qdq: onnx.ModelProto, q: dict) -> str | None:
    """The first activation onnxruntime quantised that `q`'s chosen ranges do not cover, if any."""
    ranges = q.get("_ranges")
    if not ranges:
        return None
    inits = {t.name for t in qdq.graph.initializer}
    for n in qdq.graph.node:
        name = n.input[0].removesuffix("_QuantizeLinear_Input")  # a graph output's producer, renamed
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits and name not in ranges:
            return n.input[0]
    return None


def _clean(text: str) -> str:
    """onnxruntime's message without its error-code prefix, C++ source paths and signatures: one line."""
    for pattern in ORT_NOISE:
        text = pattern.sub("", text)
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return one_line(lines[0] if lines else "", 320)


def quantisation_error(exc: Exception, float_model: Path, arrays: dict[str, np.ndarray]) -> NpubuildError:
    """The one-line error for a failed quantize_static, naming the node where that can be found."""
    text = str(exc)
    m = ORT_NODE_FAILURE.search(text)
    if m:
        return InputError(f"node '{m.group(2)}' ({m.group(1)}): onnxruntime cannot run it on the calibration "
                          f"data: {_clean(m.group(3))}")
    culprit = overflowing_node(float_model, arrays)
    if culprit is not None:
        return InputError(culprit)
    if "Load model from" in text or "InvalidGraph" in type(exc).__name__ or "INVALID_GRAPH" in text:
        return InputError(f"onnxruntime cannot load the model: {_clean(text.split('failed:', 1)[-1])}")
    return StageError(f"onnxruntime quantisation failed: {type(exc).__name__}: {_clean(text)}")


def overflowing_node(float_model: Path, arrays: dict[str, np.ndarray]) -> str | None:
    """The first node (in graph order) whose output is NaN, Inf or beyond +-1e30 on a few calibration
    samples, as an error message; None if there is none or the model cannot be run to find out."""
    import onnxruntime as ort

    try:
        model = onnx.load(str(float_model))
        known = {o.name for o in model.graph.output}
        typed = {vi.name: vi for vi in model.graph.value_info}
        for node in model.graph.node:
            for name in node.output:
                if name and name not in known and name in typed:
                    model.graph.output.append(typed[name])
                    known.add(name)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        feeds_all = {k: v[:4] for k, v in arrays.items()}
        n = next(iter(feeds_all.values())).shape[0]
        worst: dict[str, float] = {}
        for i in range(n):
            outs = session.run(names, {k: v[i] for k, v in feeds_all.items()})
            for name, value in zip(names, outs, strict=True):
                v = np.asarray(value)
                if v.dtype.kind == "f" and v.size:
                    with np.errstate(all="ignore"):
                        peak = float(np.max(np.abs(v))) if np.isfinite(v).all() else float("inf")
                    worst[name] = max(worst.get(name, 0.0), peak)
        for node in model.graph.node:
            for name in node.output:
                if worst.get(name, 0.0) > OVERFLOW:
                    return (f"node '{node.name}' ({node.op_type}): its output reaches {worst[name]:.3g} on the "
                            "calibration data, beyond what a float32 int8 scale can hold")
    except Exception:
        return None
    return None


def check_calibration_size(model: onnx.ModelProto, calibration: dict) -> None:
    """Random calibration data is held whole: refuse (one line) a model whose inputs would need more than
    MAX_CALIBRATION_BYTES for the spec's samples, before allocating any of it."""
    random = calibration.get("random")
    if not random:
        return
    for name, shape, dtype in graph_inputs(model):
        nbytes = random["samples"] * int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
        if nbytes > MAX_CALIBRATION_BYTES:
            raise InputError(f"input '{name}' of shape {list(shape)}: {random['samples']} random calibration samples "
                             f"would take {nbytes / 2**20:.0f} MiB (at most {MAX_CALIBRATION_BYTES >> 20} MiB); "
                             "lower calibration.random.samples or the input's shape")


CACHE_ARGUMENT = "calibration_cache_path"  # quantize_static's, from onnxruntime 1.32


def _calibration_cache(cache: QuantiserCache | None, path: Path, op_types: list[str], q: dict) -> dict[str, str]:
    """quantize_static's calibration cache argument for the model at `path`, or none.

    With chosen ranges the calibration is moot but still run (onnxruntime's calibrator builds a model with a
    ReduceMin/ReduceMax on every tensor and runs it), and it is the same for every range estimator: the
    same model, op types and sample. So the first candidate's calibration is kept in `cache` (onnxruntime
    saves its ranges as JSON, float32 arrays with their dtype, and loads them back exactly) and each later
    candidate of the model loads it; the key is everything that calibration reads. The first candidate's is not
    run either but written (write_moot_calibration), unless it is the one on every sample."""
    if cache is None or not q.get("_ranges") or CACHE_ARGUMENT not in _QUANTIZE_STATIC_PARAMETERS:
        return {}
    key = hashlib.sha256(path.read_bytes())
    key.update(json.dumps([sorted(op_types), bool(q.get("_all_samples"))]).encode())
    file = cache.directory / f"{key.hexdigest()}.json"
    if not q.get("_all_samples") and not file.exists():
        write_moot_calibration(path, op_types, q["_ranges"], file)
    return {CACHE_ARGUMENT: str(file)}


def write_moot_calibration(path: Path, op_types: list[str], ranges: dict[str, list[dict]], file: Path) -> None:
    """The calibration cache onnxruntime's one-sample calibration would leave at `file`, without running it (a
    session on a model with a ReduceMin/ReduceMax on every tensor, ~0.2 s a model: issue 33): the tensors its
    calibrator selects, in its order (the set it iterates, built the same way), each with its chosen range, or
    [0, 0] where the ranges have none. Every quantised tensor's scale is then its chosen range's, as it was: the
    quantiser reads a calibrated value only where no `rmin`/`rmax` override is given, and a tensor it quantises
    without one is calibrated on every sample afresh (quantize(), _uncalibrated), as it was."""
    from onnxruntime.quantization import calibrate

    model = calibrate.load_model_with_shape_infer(path)  # what the calibrator reads (frontend/ort_quantiser.py)
    tensors, _ = calibrate.CalibraterBase.select_tensors_to_calibrate(SimpleNamespace(op_types_to_calibrate=op_types),
                                                                      model)
    data = {}
    for name in tensors:
        chosen = ranges.get(name, [{}])[0]
        data[name] = tuple(np.array([chosen.get(k, 0.0)], np.float32) for k in ("rmin", "rmax"))
    calibrate.save_tensors_data(calibrate.TensorsData(ortq.CalibrationMethod.MinMax, data), file)


_QUANTIZE_STATIC_PARAMETERS = frozenset(inspect.signature(ortq.quantize_static).parameters)


def _quantize_static(path: Path, out: Path, arrays: dict[str, np.ndarray], q: dict, op_types: list[str],
                     cache: QuantiserCache | None = None) -> None:
    ranges = q.get("_ranges")  # chosen activation ranges (ptq/ranges.py): onnxruntime's calibration is then moot,
    # so it runs on one sample (a tensor the ranges miss would get that sample's range: quantize() checks)
    with linear_quantiser(cache):  # the same model, sooner (frontend/ort_quantiser.py)
        ortq.quantize_static(
            str(path),
            str(out),
            ArrayReader({k: v[:1] for k, v in arrays.items()} if ranges and not q.get("_all_samples") else arrays),
            quant_format=ortq.QuantFormat.QDQ,
            per_channel=q["per_channel"],
            activation_type=ortq.QuantType.QInt8,
            weight_type=ortq.QuantType.QInt8,
            calibrate_method=ortq.CalibrationMethod.MinMax if ranges else METHODS[q["method"]],
            op_types_to_quantize=op_types,
            extra_options={
                "ActivationSymmetric": q["symmetric_activations"],
                "WeightSymmetric": True,
                "DedicatedQDQPair": False,
                # quantize data-movement ops (MaxPool, Transpose...) even where their input is float:
                # everything the NPU runs is int8.
                "ForceQuantizeNoInputCheck": True,
                **({"TensorQuantOverrides": ranges} if ranges else entropy_options(path, arrays, q)),
            },
            **_calibration_cache(cache, path, op_types, q),
        )


def _without_one_op_type(model: onnx.ModelProto, path: Path, out: Path, arrays: dict[str, np.ndarray], q: dict,
                         op_types: list[str], cache: QuantiserCache | None = None) -> bool:
    """Quantise again with one of the model's op types left in float, in graph order; True once one works."""
    present = list(dict.fromkeys(n.op_type for n in model.graph.node if n.op_type in op_types))
    for skip in present:
        try:
            _quantize_static(path, out, arrays, q, [t for t in op_types if t != skip], cache)
        except Exception:  # noqa: BLE001 - the quantiser fails on another op type too: try the next
            continue
        return True
    return False


def vector_gemm_biases(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each constant Gemm bias of shape [1, N], [1] or [] as a [N] vector (same values by
    broadcasting): onnxruntime's quantiser takes only a 1-D bias. The model itself if there is none."""
    inits = {t.name: t for t in model.graph.initializer}
    readers: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    changes: dict[int, np.ndarray] = {}
    for k, n in enumerate(model.graph.node):
        if n.op_type != "Gemm" or len(n.input) < 3 or n.input[2] not in inits or n.input[1] not in inits:
            continue
        b_shape = list(inits[n.input[1]].dims)
        trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
        cols = b_shape[0] if trans_b else b_shape[-1]
        c = numpy_helper.to_array(inits[n.input[2]])
        if c.ndim == 1 and c.shape[0] == cols or c.size not in (1, cols) or (c.ndim == 2 and c.shape[0] != 1):
            continue
        changes[k] = np.ascontiguousarray(np.broadcast_to(c.reshape(-1), (cols,)))
    if not changes:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for k, vector in changes.items():
        node = out.graph.node[k]
        name = f"{node.input[2]}_vector"
        out.graph.initializer.append(numpy_helper.from_array(vector, name))
        node.input[2] = name
    return out


def _check_scales(qdq: onnx.ModelProto) -> None:
    """Every scale onnxruntime calibrated must be finite: a tensor with inf or NaN values has no int8 grid."""
    inits = {t.name: t for t in qdq.graph.initializer}
    for n in qdq.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[1] in inits:
            scale = numpy_helper.to_array(inits[n.input[1]])
            if not np.all(np.isfinite(scale)):
                raise InputError(f"tensor '{n.input[0]}' calibrates to a non-finite range (inf or NaN in its "
                                 f"values): int8 cannot represent it")


def quantize_model(float_model: Path, quantization: Quantization, calibration: Calibration,
                   calibration_npy: Path | None, out: Path, held_back: SampleSource | None = None,
                   feedback: dict[str, str] | None = None) -> dict:
    """The quantize stage's work: the float model quantised to a QDQ model at `out` (one quantised by another
    tool kept as it is); its metrics. `feedback` (output -> input) ties a recurrent state's grids."""
    model = onnx.load(str(float_model))
    feedback = feedback or {}
    check_feedback(model, feedback)
    if len(model.graph.node) > MAX_QUANTIZE_NODES and not is_quantized(model):
        raise InputError(f"the model has {len(model.graph.node)} nodes; onnxruntime's quantiser takes time "
                         f"quadratic in the node count (minutes past {MAX_QUANTIZE_NODES}): quantise it with "
                         "another tool (a QDQ model is kept as it is) or split it")
    if is_quantized(model):  # quantised by another tool (QDQ, or QOperator normalised at import): keep it
        write_bytes(out, model.SerializeToString())
        return {"prequantized": True, "calibration_samples": 0,
                **{op: sum(n.op_type == op for n in model.graph.node) for op in ("QuantizeLinear", "DequantizeLinear")}}
    check_calibration_size(model, calibration.model_dump())
    arrays = calibration_rows(model, calibration, calibration_npy, held_back)
    qdq, choice = quantize_chosen(float_model, model, arrays,
                                  resolve_auto(quantization.model_dump(), calibration.model_dump()), feedback)
    recipe = choice.to_json()
    if feedback:  # which fed-back states share their output's grid (each candidate was tied as it was built)
        recipe["feedback"] = tie_feedback(qdq, feedback)
    write_bytes(out, qdq.SerializeToString())
    counts = {"QuantizeLinear": 0, "DequantizeLinear": 0}
    for n in qdq.graph.node:
        if n.op_type in counts:
            counts[n.op_type] += 1
    return {"calibration_samples": int(next(iter(arrays.values())).shape[0]), "quantization": recipe, **counts}


def calibration_rows(model: onnx.ModelProto, calibration: Calibration, calibration_npy: Path | None,
                     held_back: SampleSource | None) -> dict[str, np.ndarray]:
    """The rows the quantize stage calibrates on: the spec's calibration data less the rows held back for the
    checks (they calibrate nothing: frontend/samples.py). debug-numerics equalises with the same rows."""
    arrays = calibration_arrays(model, calibration.model_dump(), calibration_npy)
    return held_back.calibration_rows(arrays) if held_back is not None else arrays


RANDOM_CALIBRATION = {"method": "minmax", "bias_correction": False, "equalization": False}


def resolve_auto(q: dict, calibration: dict) -> dict:
    """The spec's quantisation settings, with each `auto` choice fixed to MinMax, no bias correction and no
    equalisation when the calibration is random: seeded noise says nothing about the inputs the model
    will see, so there is nothing to choose by (and such a build stays what it was, as fast)."""
    if not calibration.get("random"):
        return q
    return {**q, **{k: v for k, v in RANDOM_CALIBRATION.items() if q.get(k, "auto") == "auto"}}


def quantize_chosen(float_model: Path, model: onnx.ModelProto, arrays: dict[str, np.ndarray],
                    q: dict, feedback: dict[str, str] | None = None) -> tuple[onnx.ModelProto, Choice]:
    """The QDQ model of the recipe the spec asks for, or (each choice "auto") of the one that measures
    closest to float on the calibration data (ptq/choose.py); each candidate with its fed-back states'
    inputs on their outputs' grids (frontend/qdq_feedback.py), as it will run."""
    made: list[Scorer] = []

    def scorer() -> Scorer:  # float's outputs on the scoring rows, computed once for the choice and the ratio step
        if not made:
            made.append(Scorer(model, arrays))
        return made[0]

    with tempfile.TemporaryDirectory(prefix="npubuild-calib-") as tmp_cache:
        cache = QuantiserCache(Path(tmp_cache))  # what one candidate's quantisation leaves for the next
        qdq, choice = choose(model, arrays, q, candidate_builder(float_model, model, arrays, cache, feedback), scorer)
    # residual sums' operands in 64ths (qdq_add_ratio.py), scored by the same measure the choice took
    choice.add_ratio = snap_if_free(qdq, model, arrays, scorer, choice.score)
    return qdq, choice


def candidate_builder(float_model: Path, model: onnx.ModelProto, arrays: dict[str, np.ndarray],
                      cache: QuantiserCache, feedback: dict[str, str] | None = None) -> Callable:
    """`build(settings, candidate)`: the finished QDQ model of `candidate` (`model`, loaded from `float_model`,
    or an equalised copy of it) quantised with `settings`, as ptq/choose.py scores it and the stage writes it
    (bench/recipe_choice.py builds every candidate with it too)."""

    def build(settings: dict, candidate: onnx.ModelProto) -> onnx.ModelProto:
        if candidate is model:
            qdq = quantize(float_model, arrays, settings, cache)
        else:  # an equalised float model
            with tempfile.TemporaryDirectory(prefix="npubuild-eq-") as tmp:
                path = Path(tmp) / "float.onnx"
                onnx.save(candidate, path)
                qdq = quantize(path, arrays, settings, cache)
        share_concat_scales(qdq, settings["symmetric_activations"])  # TFLite-style concat scales
        tie_feedback(qdq, feedback or {})
        return qdq

    return build
