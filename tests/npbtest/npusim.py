"""Helpers for the npu-sim tests: single-op ONNX -> int8 TOSA -> Vela raw -> npu-sim vs the TOSA reference model."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npbtest.ops import calib, io_dict, quantize_model
from npubuild.lowering.driver import lower_model
from npubuild.lowering.options import LoweringOptions
from npubuild.npusim.npu_op import SimResult
from npubuild.npusim.npz import RawModel, load_raw
from npubuild.npusim.sim import run, run_samples
from npubuild.tosa.run import _quiet_stdio


def lower_int(model: onnx.ModelProto, input_shape: list[int],
              options: LoweringOptions | None = None) -> tuple[bytes, dict]:
    """Quantize (calibrating every graph input) and lower to int8 TOSA; returns (tosa, io)."""
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    cal = {}
    for n, (name, shape) in enumerate(shapes.items()):
        cal.update(calib(name, shape or input_shape, seed=100 + n))
    qdq = quantize_model(model, cal)
    lowered = lower_model(qdq, "int", options=options)
    return lowered.tosa, io_dict(lowered)


def vela_raw(tosa: bytes, out_dir: Path, accelerator: str = "ethos-u55-128", *flags: str) -> Path:
    """Compile with Vela (real) to --output-format raw; returns the .npz."""
    src = out_dir / "m.tosa"
    src.write_bytes(tosa)
    proc = subprocess.run([sys.executable, "-m", "ethosu.vela", str(src), "--accelerator-config", accelerator,
                           "--output-format", "raw", "--output-dir", str(out_dir / "out"), *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return next((out_dir / "out").glob("*_vela.npz"))


def reference(tosa: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import tosa_reference_model as trm

    with _quiet_stdio():
        outs, status = trm.run(tosa, [np.ascontiguousarray(x) for x in inputs])
    assert "VALID" in str(status), status
    return [np.asarray(o) for o in outs]


def tosa_inputs(io: dict, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for spec in io["inputs"]:
        info = np.iinfo(np.dtype(spec["dtype"]))
        out.append(rng.integers(info.min, info.max + 1, spec["shape"]).astype(spec["dtype"]))
    return out


def assert_bitexact(tosa: bytes, io: dict, npz: Path, seeds=(0, 1, 2)) -> None:
    """npu-sim on the compiled artifact equals the TOSA reference model, element for element; and the seeds
    run as one batch give what each gives alone (`assert_batch_is_each_alone`)."""
    model = load_raw(npz)
    samples, alone = [], []
    for seed in seeds:
        xs = tosa_inputs(io, seed)
        want = reference(tosa, xs)
        res = run(model, xs)
        for i, (w, g) in enumerate(zip(want, res.outputs, strict=True)):
            g = g.reshape(w.shape)
            bad = int(np.count_nonzero(w != g))
            assert bad == 0, f"output {i}, seed {seed}: {bad}/{w.size} elements differ"
        samples.append(xs)
        alone.append(res)
    assert_batch_is_each_alone(model, samples, alone)


def assert_batch_is_each_alone(model: RawModel, samples: list[list[np.ndarray]], alone: list[SimResult]) -> None:
    """npu-sim runs a stage's samples in one pass over the command stream (memory with a sample axis, on
    every generation): each sample's outputs and every op's OFM must be what running it alone gave."""
    together = run_samples(model, samples)
    assert len(together) == len(samples)
    for n, (one, got) in enumerate(zip(alone, together, strict=True)):
        assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(one.outputs, got.outputs, strict=True)), n
        assert len(one.ops) == len(got.ops)
        for a, b in zip(one.ops, got.ops, strict=True):
            assert (a.kind, a.ofm_shape, a.ifm_shape, a.ofm_format, a.detail) == (
                b.kind, b.ofm_shape, b.ifm_shape, b.ofm_format, b.detail), (n, a.index)
            assert a.ofm.shape == b.ofm.shape and np.array_equal(a.ofm, b.ofm), f"sample {n}, op {a.index} {a.kind}"


def compile_and_check(model: onnx.ModelProto, input_shape: list[int], accelerator: str = "ethos-u55-128",
                      *flags: str, options: LoweringOptions | None = None) -> RawModel:
    """Lower, compile, assert bit-exact on three seeds; returns the loaded artifact."""
    tosa, io = lower_int(model, input_shape, options)
    with tempfile.TemporaryDirectory() as tmp:
        npz = vela_raw(tosa, Path(tmp), accelerator, *flags)
        assert_bitexact(tosa, io, npz)
        return load_raw(npz)


def mean_then_channel_mul(time_steps: int = 16, channels: int = 64) -> onnx.ModelProto:
    """The wake-word head's form: a mean over time of [1, T, C], then a Mul by a constant per channel."""
    rng = np.random.default_rng(3)
    gain = numpy_helper.from_array(rng.uniform(0.25, 2.0, channels).astype(np.float32), "gain")
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=0),
             helper.make_node("Mul", ["mean", "gain"], ["y"])]
    graph = helper.make_graph(nodes, "mean_mul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, time_steps, channels])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels])], [gain])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model
