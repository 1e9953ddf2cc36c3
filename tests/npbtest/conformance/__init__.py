"""ONNX's backend node tests (shipped in the onnx package) run through npubuild's own stages, in process.

Selection: every test under onnx/backend/test/data/node of an op in EMBEDDED_OPS (the function-body
`_expanded` variants count as their op's tests) whose inputs are float32, or int64 (shapes, axes, indices),
and whose outputs numpy can hold (not float8 or 4-bit types). The int64 inputs and the op's parameters
(weights, norm scales, Resize scales, Clip bounds: PARAMETER_INPUTS) are fed as constants, as an exported
embedded model has them. Only test_data_set_0 is run; its arrays fix the input shapes (input_shapes).

Per test, with the stages' own functions (import normalisation, onnxruntime quantisation and the quantize
stage's post-passes, the pipeline's passes, the lower stage's lowering, host fallback and per-family
partitioning, the TOSA reference model, Vela with npubuild's .ini):

- FP: the float model lowered to TOSA PRO-FP (its portable split if some node runs on the host) against
  the test's expected outputs: same shapes, NaN/inf at the same positions, the rest within
  rtol 1e-3 + atol 1e-4 (float32 arithmetic in another order), bool and integer outputs exact.
- INT: the model quantised with the test's own inputs as calibration, lowered to PRO-INT, against
  onnxruntime on the QDQ model: same shapes, <= 1 LSB on quantized outputs, exact on the others; then each
  NPU partition of the U55 and U85 families (ethos-u55-128, ethos-u85-256) compiled by Vela, which must
  take it whole onto the NPU.

Outcomes: pass; host (right, with some node on the host, and the reason); wrong (numbers, shapes, a stage
that fails on valid input, or a placement Vela rejects); unsupported (npubuild's own one-line input
error); crash (any other Python exception out of npubuild). The same functions run npubuild trees that
predate the host fallback (bench/conformance.py measures before/after): without it a node that does not
lower is `unsupported`.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from npubuild.config.load import default_search_path, load_pipeline, load_target
from npubuild.errors import InputError, Location, NpubuildError
from npubuild.ethosu.vela import parse_operator_counts, vela_command
from npubuild.ethosu.vela_ini import render_ini
from npubuild.frontend.normalise import normalise
from npubuild.frontend.passes import run_passes
from npubuild.frontend.qdq_concat import share_concat_scales
from npubuild.frontend.quantize import quantize
from npubuild.records.iospec import IOSpec
from npubuild.tosa.run import OnnxSession, run_tosa

REPO = Path(__file__).resolve().parents[3]
NODE_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
EXPANDED = "_expanded"

# Ops an embedded (vision, audio, sensor, small-transformer) model is made of.
EMBEDDED_OPS = frozenset("""
Abs Add And ArgMax ArgMin AveragePool BatchNormalization Cast CastLike Ceil Celu Clip Concat Constant
ConstantOfShape Conv ConvTranspose DepthToSpace Div Dropout Einsum Elu Equal Erf Exp Expand Flatten Floor GRU
Gather GatherElements Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual GroupNormalization
HardSigmoid HardSwish Hardmax Identity InstanceNormalization LRN LSTM LayerNormalization LeakyRelu Less
LessOrEqual Log LogSoftmax LpNormalization MatMul Max MaxPool Mean Min Mish Mul Neg Not PRelu Pad Pow
RMSNormalization RNN Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean
ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize Round Selu Shape Shrink Sigmoid Sign Size
Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Swish Tanh ThresholdedRelu Tile TopK
Transpose Unsqueeze Upsample Where
""".split())

# Inputs an exported model has as initializers (weights, norm parameters, Resize scales, Clip bounds...):
# the tests feed them as data, here they are fed as constants (by input position of the op's node).
PARAMETER_INPUTS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "PRelu": (1,), "BatchNormalization": (1, 2, 3, 4),
    "InstanceNormalization": (1, 2), "LayerNormalization": (1, 2), "GroupNormalization": (1, 2),
    "RMSNormalization": (1,), "Resize": (1, 2), "Upsample": (1,), "Clip": (1, 2), "Pad": (2,), "Dropout": (1,),
    "GRU": (1, 2, 3), "LSTM": (1, 2, 3, 7), "RNN": (1, 2, 3),
}
FP_RTOL, FP_ATOL = 1e-3, 1e-4
MAX_INT_LSB = 1.0
VELA_TARGETS = (("u55", "ethos-u55-128"), ("u85", "ethos-u85-256"))
QUANTIZATION = {"per_channel": True, "method": "minmax", "symmetric_activations": False}

NUMPY_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16,
                         TensorProto.BOOL, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.INT32,
                         TensorProto.INT64})

Outcome = Literal["pass", "host", "wrong", "unsupported", "crash"]
OUTCOMES: tuple[Outcome, ...] = ("pass", "wrong", "unsupported", "host", "crash")


@dataclass(frozen=True)
class NodeCase:
    name: str  # the test directory's name, e.g. test_softmax_axis_0_expanded
    op: str

    @property
    def dir(self) -> Path:
        return NODE_DIR / self.name


@dataclass(frozen=True)
class Result:
    outcome: Outcome
    detail: str = ""
    seconds: float = 0.0


def _graph_of(name: str) -> onnx.GraphProto:
    return onnx.load(str(NODE_DIR / name / "model.onnx"), load_external_data=False).graph


def _op_of(name: str, names: set[str]) -> str | None:
    """The op a test is about: its one node type, or for an `_expanded` body the op of the plain test."""
    if EXPANDED in name:
        base = name[:name.index(EXPANDED)]
        if base not in names:
            return None
        name = base
    ops = {n.op_type for n in _graph_of(name).node} - {"Constant"}
    return next(iter(ops)) if len(ops) == 1 else None


def _elem_types(values) -> list[int]:
    return [v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else -1 for v in values]


def _selectable(graph: onnx.GraphProto) -> bool:
    """float32 data in (int64 constants beside it), and out only types numpy holds (no float8, 4-bit)."""
    types = _elem_types(graph.input)
    return (all(t in (TensorProto.FLOAT, TensorProto.INT64) for t in types) and TensorProto.FLOAT in types
            and all(t in NUMPY_TYPES for t in _elem_types(graph.output)))


@cache
def select() -> tuple[NodeCase, ...]:
    """The node tests of EMBEDDED_OPS with float32 (and int64 constant) inputs, in name order."""
    names = {p.name for p in NODE_DIR.iterdir() if (p / "model.onnx").is_file()}
    out = []
    for name in sorted(names):
        op = _op_of(name, names)
        if op in EMBEDDED_OPS and _selectable(_graph_of(name)):
            out.append(NodeCase(name, op))
    return tuple(out)


# ---------------------------------------------------------------------------------------------- loading


@dataclass
class Loaded:
    model: onnx.ModelProto  # int64 inputs turned into initializers
    inputs: dict[str, np.ndarray]  # the float32 inputs
    expected: dict[str, np.ndarray]

    @property
    def shapes(self) -> dict[str, list[int]]:
        """The inputs' shapes, as a spec's input_shapes gives them."""
        return {k: list(v.shape) for k, v in self.inputs.items()}


def _tensors(d: Path, prefix: str) -> list[np.ndarray]:
    files = sorted(d.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
    return [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in files]


def parameter_names(case: NodeCase) -> set[str]:
    """The graph inputs that are the op's parameters (PARAMETER_INPUTS), by the plain test's node."""
    base = case.name[:case.name.index(EXPANDED)] if EXPANDED in case.name else case.name
    node = next((n for n in _graph_of(base).node if n.op_type == case.op), None)
    slots = PARAMETER_INPUTS.get(case.op, ())
    return {node.input[i] for i in slots if node is not None and i < len(node.input) and node.input[i]}


def load(case: NodeCase) -> Loaded:
    model = onnx.load(str(case.dir / "model.onnx"))
    data = case.dir / "test_data_set_0"
    arrays = _tensors(data, "input")
    g = model.graph
    inputs: dict[str, np.ndarray] = {}
    graph_inputs = [vi for vi in g.input if vi.name not in {i.name for i in g.initializer}]
    parameters = parameter_names(case)
    for vi, a in zip(graph_inputs, arrays, strict=False):
        if vi.type.tensor_type.elem_type == TensorProto.INT64 or vi.name in parameters:
            g.initializer.append(numpy_helper.from_array(a, vi.name))
            g.input.remove(vi)
        else:
            inputs[vi.name] = a
    expected = dict(zip([o.name for o in g.output], _tensors(data, "output"), strict=False))
    return Loaded(model, inputs, expected)


@cache
def _pipeline_passes(name: str) -> tuple[str, ...]:
    pipeline, _ = load_pipeline(name, default_search_path(REPO), Location("<conformance>"))
    return tuple(pipeline.passes)


def _passes(model: onnx.ModelProto, pipeline: str) -> onnx.ModelProto:
    import onnx_ir as ir

    return ir.serde.serialize_model(run_passes(ir.serde.deserialize_model(model), list(_pipeline_passes(pipeline))))


# ---------------------------------------------------------------------------------------------- lowering


@dataclass
class Lowered:
    """What the lower stage made of a model: how to run it, its io, and per family the NPU partitions."""

    run: object  # feeds -> ONNX-layout outputs (raw integers for quantized ones)
    outputs: tuple[IOSpec, ...]
    host: tuple[str, ...]  # "node (op): reason" of each node on the host on every family
    npu_parts: dict[str, list[Path]]  # family -> its NPU partitions' .tosa files


def lower(model: onnx.ModelProto, profile: Literal["int", "fp"], out_dir: Path) -> Lowered:
    """The lower stage on `model` (already through the pipeline's passes), writing into `out_dir`."""
    try:
        from npubuild.ethosu.families import lower_families
        from npubuild.verify.tosa_check import graph_runner
    except ImportError:  # an npubuild without host fallback: one TOSA graph or an input error
        return _lower_legacy(model, profile, out_dir)
    fams = tuple(f for f, _ in VELA_TARGETS) if profile == "int" else ()
    rec, _ = lower_families(model, profile, out_dir, families=fams)
    host = tuple(f"{p.node} ({p.op_type}): {p.reason}" for p in (rec.portable.placements if rec.portable else ())
                 if p.kind != "npu")  # "cpu" in older trees, Where.HOST now
    parts = {f: [out_dir / p.file for p in r.partitions if p.kind == "npu"] for f, r in rec.families.items()}
    return Lowered(graph_runner(rec, out_dir), tuple(rec.outputs), host, parts)


def _lower_legacy(model: onnx.ModelProto, profile: Literal["int", "fp"], out_dir: Path) -> Lowered:
    from npubuild.ethosu.partition import plan_partitions, write_partitions
    from npubuild.lowering.driver import lower_model

    lowered = lower_model(model, profile)
    (out_dir / "model.tosa").write_bytes(lowered.tosa)
    parts: dict[str, list[Path]] = {}
    if profile == "int":
        for fam, _ in VELA_TARGETS:
            plan = plan_partitions(model, lowered, fam)
            if len(plan.partitions) == 1 and plan.partitions[0].kind == "npu":
                parts[fam] = [out_dir / "model.tosa"]
            else:
                recs = write_partitions(model, plan, profile, out_dir, f"{fam}_", family=fam)
                parts[fam] = [out_dir / r.file for r in recs if r.kind == "npu"]
    return Lowered(lambda feeds: run_tosa(lowered.tosa, lowered, feeds), tuple(lowered.outputs), (), parts)


# ---------------------------------------------------------------------------------------------- comparing


def _shape_line(name: str, got: np.ndarray, want: np.ndarray, what: str) -> str | None:
    if np.shape(got) != np.shape(want):
        return f"output '{name}': shape {list(np.shape(got))}, {what} {list(np.shape(want))}"
    return None


def _nonfinite_line(name: str, got: np.ndarray, want: np.ndarray) -> str | None:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    bad = (np.isnan(g) != np.isnan(w)) | (np.isposinf(g) != np.isposinf(w)) | (np.isneginf(g) != np.isneginf(w))
    return f"output '{name}': {int(bad.sum())} NaN/inf elements differ" if bad.any() else None


def compare_fp(outputs: tuple[IOSpec, ...], got: dict, expected: dict) -> str | None:
    """None if every output matches the test's expected output, else one line saying how it does not."""
    for spec in outputs:
        name = spec.onnx_name
        g, w = np.asarray(got[name]), np.asarray(expected[name])
        line = _shape_line(name, g, w, "expected") or _nonfinite_line(name, g, w)
        if line:
            return line
        if w.dtype.kind in "biu":
            if not np.array_equal(g.astype(w.dtype), w):
                return f"output '{name}': {int(np.sum(g.astype(w.dtype) != w))} of {w.size} elements differ"
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w64)
        err = np.abs(g64 - w64)[finite]
        limit = (FP_ATOL + FP_RTOL * np.abs(w64))[finite]
        if np.any(err > limit):
            return f"output '{name}': max abs error {float(err.max()):.3g} (tolerance {FP_ATOL} + {FP_RTOL}|x|)"
    return None


def compare_int(outputs: tuple[IOSpec, ...], got: dict, ref: dict) -> str | None:
    """None if every output is within MAX_INT_LSB of onnxruntime's QDQ result (exact if not quantized)."""
    for spec in outputs:
        name = spec.onnx_name
        g, r = np.asarray(got[name]), np.asarray(ref[name])
        line = _shape_line(name, g, r, "onnxruntime") or _nonfinite_line(name, spec.dequantize(g), r)
        if line:
            return line
        if spec.quantized:
            err = float(np.max(spec.lsb_error(r, g))) if g.size else 0.0
            if err > MAX_INT_LSB:
                return f"output '{name}': {err:g} LSB from onnxruntime's QDQ model"
        elif r.dtype.kind in "biu" and not np.array_equal(g.astype(r.dtype), r):
            return f"output '{name}': {int(np.sum(g.astype(r.dtype) != r))} of {r.size} elements differ"
        elif r.dtype.kind == "f":
            finite = np.isfinite(r)
            err = np.abs(g.astype(np.float64) - r)[finite]
            if np.any(err > FP_ATOL + FP_RTOL * np.abs(r[finite])):
                return f"output '{name}' (float): max abs error {float(err.max()):.3g}"
    return None


# ---------------------------------------------------------------------------------------------- Vela


def _vela_main(argv: list[str]) -> tuple[int, str]:
    """Vela in a worker process (50x faster than a new interpreter per graph); its exit code and output."""
    from ethosu.vela import vela

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = vela.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # noqa: BLE001 - Vela's own error, reported as the placement's failure
            return 1, f"{type(exc).__name__}: {exc}"
    return int(code or 0), buf.getvalue()


class VelaRunner:
    """Vela on one graph at a time, in one long-lived worker process with npubuild's .ini per accelerator.

    A graph Vela crashes on (the worker dies) is reported as a failed compile and the worker restarted."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="npubuild-conformance-vela-")
        self._profiles: dict[str, tuple] = {}
        self.compiles = 0  # graphs compiled (bench/conformance.py reports it)

    def _profile(self, accelerator: str) -> tuple:
        if accelerator not in self._profiles:
            profile, _ = load_target(accelerator, default_search_path(REPO), None)
            ini = Path(self._dir.name) / f"{accelerator}.ini"
            ini.write_text(render_ini(profile))
            self._profiles[accelerator] = (profile, ini)
        return self._profiles[accelerator]

    def compile(self, tosa: Path, accelerator: str) -> str | None:
        """None if Vela puts the whole graph on the NPU, else one line saying what happened."""
        profile, ini = self._profile(accelerator)
        out = tosa.parent / f"vela-{accelerator}-{tosa.stem}"
        argv = vela_command(tosa, ini, out, profile, profile.vela)[3:]  # after `python -m ethosu.vela`
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1)
        self.compiles += 1
        try:
            code, text = self._pool.submit(_vela_main, argv).result(timeout=300)
        except BrokenProcessPool:
            self._pool = None
            return f"Vela crashed on {tosa.name} ({accelerator})"
        if code != 0:
            last = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [f"exit {code}"]
            return f"Vela failed on {tosa.name} ({accelerator}): {last[0][:200]}"
        npu, cpu = parse_operator_counts(text)
        if cpu:
            return f"Vela left {cpu} of {npu + cpu} operators of {tosa.name} on the CPU ({accelerator})"
        return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self._dir.cleanup()


# ---------------------------------------------------------------------------------------------- running


def _outcome(lowered: Lowered, problem: str | None) -> Result:
    if problem:
        return Result("wrong", problem)
    if lowered.host:
        return Result("host", "; ".join(lowered.host))
    return Result("pass")


def _guarded(fn, case: NodeCase, *args) -> Result:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="npubuild-conformance-") as tmp:
        try:
            result = fn(case, Path(tmp), *args)
        except InputError as exc:
            result = Result("unsupported", str(exc))
        except NpubuildError as exc:  # a stage failing on valid input: the build would fail
            result = Result("wrong", str(exc))
        except Exception as exc:  # noqa: BLE001 - what this runner exists to find
            result = Result("crash", f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
    return Result(result.outcome, result.detail, round(time.perf_counter() - start, 4))


def _fp(case: NodeCase, tmp: Path) -> Result:
    data = load(case)
    model = _passes(normalise(data.model, data.shapes, case.name), "fp")
    lowered = lower(model, "fp", tmp)
    got = lowered.run(data.inputs)
    return _outcome(lowered, compare_fp(lowered.outputs, got, data.expected))


def _int(case: NodeCase, tmp: Path, vela: VelaRunner | None) -> Result:
    data = load(case)
    model = normalise(data.model, data.shapes, case.name)
    float_path = tmp / "float.onnx"
    onnx.save(model, float_path)
    qdq = quantize(float_path, {k: v[None] for k, v in data.inputs.items()}, QUANTIZATION)
    share_concat_scales(qdq, QUANTIZATION["symmetric_activations"])
    qdq = _passes(qdq, "default")
    ref = OnnxSession(qdq.SerializeToString())(data.inputs)
    lowered = lower(qdq, "int", tmp)
    problem = compare_int(lowered.outputs, lowered.run(data.inputs), ref)
    if problem is None and vela is not None:
        for fam, accelerator in VELA_TARGETS:
            for part in lowered.npu_parts.get(fam, []):
                problem = problem or vela.compile(part, accelerator)
    return _outcome(lowered, problem)


def run_fp(case: NodeCase) -> Result:
    return _guarded(_fp, case)


def run_int(case: NodeCase, vela: VelaRunner | None = None) -> Result:
    return _guarded(_int, case, vela)


def quiet_onnxruntime() -> None:
    """onnxruntime's C++ warnings (unused initializers...) on every session: not the runner's output."""
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    os.environ.setdefault("ORT_LOGGING_LEVEL", "3")
