"""Run TOSA graphs on the TOSA reference model and onnx models on onnxruntime, in ONNX's layout."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnxruntime as ort

from npubuild.errors import StageError
from npubuild.records.iospec import GraphIO
from npubuild.tosa.memo import RunMemo, graph_key, model_key


@contextmanager
def _quiet_stdio():
    """The reference model prints version warnings on the C stdout/stderr: keep them off the user's screen."""
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


# The reference model's time on a TOSA graph over onnxruntime's on its QDQ model, one sample, at the low end
# of what the examples measure (23-83x; DS-CNN 23x, the transformer 37x, MobileViT-xxs 83x): an estimate that
# says whether a stage's runs are worth worker processes (npubuild/fanout.py), on the side of too few
REFERENCE_MODEL_PER_ONNXRUNTIME = 20.0


_recording: RunMemo | None = None  # where run_tosa keeps its runs' raw outputs (recording())


@contextmanager
def recording() -> Iterator[RunMemo]:
    """Keep every run_tosa run made inside, by its key (tosa/memo.py), in the memo yielded: its raw outputs,
    as the reference model gave them, for a later stage that would run the same graph on the same inputs."""
    global _recording
    outer, _recording = _recording, RunMemo()
    try:
        yield _recording
    finally:
        _recording = outer


def run_tosa(tosa: bytes, io: GraphIO, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feed ONNX-layout float inputs (quantized here for int8 graphs); returns ONNX-layout outputs.

    Integer outputs are returned as raw integers; callers dequantize with their IOSpec.
    """
    import tosa_reference_model as trm

    arrays = [spec.to_tosa(np.asarray(feeds[spec.onnx_name])) for spec in io.inputs]
    with _quiet_stdio():
        try:
            outputs, status = trm.run(tosa, arrays)
        except ValueError as exc:  # the reference model's verdict on a graph it will not run at all
            raise StageError(f"TOSA reference model rejected the graph: {exc}") from None
    if "VALID" not in str(status):
        raise StageError(f"TOSA reference model rejected the graph: {status}")
    if _recording is not None:
        _recording.put(graph_key(tosa, arrays), {str(i): np.asarray(y) for i, y in enumerate(outputs)})
    return {spec.onnx_name: spec.from_tosa(y) for spec, y in zip(io.outputs, outputs, strict=True)}


class OnnxSession:
    """One onnxruntime session (CPU, quiet) run on many samples: a session per call costs more than the run.

    `qdq_semantics` keeps the graph as written (DQ -> float op -> Q), the reference every check compares
    against: onnxruntime's optimised session fuses some Q/DQ chains into int8 kernels that round
    differently (QLinearSoftmax rounds as if the output scale were 1/256: up to 1.2 LSB per softmax,
    amplified by the layers after it; the transformer example measured 29 dB against it, 33-35 dB against
    the QDQ semantics). Off, it runs as a deployed host partition would (onnxruntime's defaults).
    """

    def __init__(self, model: str | Path | bytes, qdq_semantics: bool = True):
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if qdq_semantics:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.sess = ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts,
                                         providers=["CPUExecutionProvider"])
        if any(o.type == "tensor(bfloat16)" for o in self.sess.get_outputs()):
            self.sess = ort.InferenceSession(bfloat16_outputs_as_float(model), opts,
                                             providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.sess.get_outputs()]

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # a rank-0 input's sample is a numpy scalar (v[i] of its (N,) array), which onnxruntime will not take
        arrays = {k: v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in feeds.items()}
        return dict(zip(self.names, self.sess.run(self.names, arrays), strict=True))


class RememberedSession:
    """An OnnxSession (the QDQ semantics) whose runs are looked up in `memo` first (tosa/memo.py: by the
    model file's bytes and the feeds) and kept there when made; the session is only created for a run the
    memo does not have. tosa-check fills the memo, npu-sim reads it (the same models on the same samples)."""

    OPTIONS = "qdq_semantics"

    def __init__(self, model: Path, memo: RunMemo):
        self.model, self.memo = Path(model), memo
        self._session: OnnxSession | None = None
        self._digest: bytes | None = None

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._digest is None:
            self._digest = hashlib.sha256(self.model.read_bytes()).digest()
        key = model_key(self._digest, self.OPTIONS, feeds)
        got = self.memo.get(key)
        if got is None:
            if self._session is None:
                self._session = OnnxSession(self.model)
            got = self._session(feeds)
            self.memo.put(key, got)
        return got


def timed_runs(session: OnnxSession, feeds_of: list[dict[str, np.ndarray]]) -> tuple[list[dict[str, np.ndarray]], float]:
    """onnxruntime's outputs on every sample, and its fastest run's seconds: what says whether the reference
    model's runs of the same samples are worth worker processes (the first run also pays for onnxruntime's lazy
    set-up: 4x a DS-CNN run)."""
    outputs, fastest = [], float("inf")
    for feeds in feeds_of:
        start = time.perf_counter()
        outputs.append(session(feeds))
        fastest = min(fastest, time.perf_counter() - start)
    return outputs, fastest if outputs else 0.0


def bfloat16_outputs_as_float(model: str | Path | bytes) -> bytes:
    """The model with each bfloat16 graph output cast to float32 (exact: bfloat16 is float32's top half).
    onnxruntime's Python binding returns no bfloat16 arrays; the values are the same, in a type numpy has."""
    import onnx

    proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
    g = proto.graph
    for out in g.output:
        tt = out.type.tensor_type
        if tt.elem_type != onnx.TensorProto.BFLOAT16:
            continue
        inner = f"{out.name}__bfloat16"
        for n in g.node:
            n.output[:] = [inner if o == out.name else o for o in n.output]
            n.input[:] = [inner if i == out.name else i for i in n.input]
        g.node.append(onnx.helper.make_node("Cast", [inner], [out.name], to=onnx.TensorProto.FLOAT,
                                            name=f"{out.name}__as_float"))
        tt.elem_type = onnx.TensorProto.FLOAT
    return proto.SerializeToString()
