"""The TFLite route of one real model: an int8 .tflite as a user makes it today, and its outputs on given inputs.

A benchmark helper of bench/real_routes.py, not part of npubuild. It runs in a scratch venv with TensorFlow:

- `--original X.tflite` (the model came as TFLite: MediaPipe, openWakeWord): TFLite's own post-training
  calibrator on that file (`tensorflow.lite.python.optimize.calibrator`, the full-int8 quantiser the converter
  runs, int8 in and out). Its float16 constants (DEQUANTIZE ops, as MediaPipe ships them) are made float32
  first: the calibrator of TF 2.21 crashes on that form; the float function is the same.
  Run with TF 2.21 (the lead's /work/scratch/realgen/s/tfvenv).
- `--onnx M.onnx` (the model came as ONNX): onnx2tf 1.29.24 -> saved_model -> TFLiteConverter full int8
  (bench/tflite_route.py's route). Run in onnx2tf's venv (it pins TF 2.19).

Both calibrate on the spec's own calibration file (`--calib`, .npy or .npz, ONNX layout), every sample.
`--eval X.npz` then runs the int8 model on the held-back inputs (ONNX input names, ONNX layout) and writes the
dequantised outputs, in ONNX layout under the ONNX output names, to `--outputs`. `--info` gets a JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def load_arrays(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """Samples per ONNX input name: an .npy is the first input's, an .npz is keyed by input name."""
    if path.suffix == ".npz":
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    return {names[0]: np.load(path)}


def fp16_constants_as_fp32(src: Path, dst: Path) -> None:
    """The same float model with its float16 constants (read through DEQUANTIZE) stored as float32."""
    from tensorflow.lite.python import schema_py_generated as S
    from tensorflow.lite.tools import flatbuffer_utils as fu

    m = fu.read_model(str(src))
    deq = {i for i, c in enumerate(m.operatorCodes)
           if max(c.builtinCode, c.deprecatedBuiltinCode) == S.BuiltinOperator.DEQUANTIZE}
    for sg in m.subgraphs:
        keep = []
        for op in sg.operators:
            if op.opcodeIndex in deq:
                src_t = sg.tensors[op.inputs[0]]
                buf = m.buffers[src_t.buffer]
                if src_t.type == S.TensorType.FLOAT16 and buf.data is not None and len(buf.data):
                    vals = np.frombuffer(bytes(bytearray(buf.data)), dtype=np.float16).astype(np.float32)
                    nb = S.BufferT()
                    nb.data = np.frombuffer(vals.tobytes(), dtype=np.uint8)
                    m.buffers.append(nb)
                    sg.tensors[op.outputs[0]].buffer = len(m.buffers) - 1
                    continue
            keep.append(op)
        sg.operators = keep
    used = sorted({op.opcodeIndex for sg in m.subgraphs for op in sg.operators})
    remap = {old: new for new, old in enumerate(used)}
    m.operatorCodes = [m.operatorCodes[i] for i in used]
    for sg in m.subgraphs:
        for op in sg.operators:
            op.opcodeIndex = remap[op.opcodeIndex]
    fu.write_model(m, str(dst))


def quantize_original(src: Path, calib: dict[str, np.ndarray], work: Path) -> Path:
    """TFLite's post-training full-int8 calibrator on the original float .tflite."""
    import tensorflow as tf
    from tensorflow.lite.python.optimize import calibrator

    f32 = work / "float32.tflite"
    fp16_constants_as_fp32(src, f32)
    interp = tf.lite.Interpreter(model_path=str(f32))
    details = interp.get_input_details()
    ordered = [calib[k] for k in calib]  # single-input originals here; several are fed in file order
    n = len(ordered[0])

    def gen():
        for i in range(n):
            yield [x[i].reshape(d["shape"]).astype(np.float32) for x, d in zip(ordered, details, strict=True)]

    q = calibrator.Calibrator(f32.read_bytes()).calibrate_and_quantize(
        gen, tf.int8, tf.int8, False, activations_type=tf.int8, bias_type=tf.int32, resize_input=False)
    out = work / "model_int8.tflite"
    out.write_bytes(q)
    return out


def to_tf_layout(x: np.ndarray, tf_shape: list[int]) -> np.ndarray:
    """onnx2tf makes rank-3/4 NC... inputs channel-last; follow it when the shapes say so."""
    if list(x.shape) == list(tf_shape):
        return x
    if x.size == int(np.prod(tf_shape)) and x.ndim != len(tf_shape):
        return x.reshape(tf_shape)
    y = x.transpose([0, *range(2, x.ndim), 1])
    if list(y.shape) != list(tf_shape):
        raise RuntimeError(f"cannot map ONNX input {x.shape} to TF input {tf_shape}")
    return y


def from_tf_layout(y: np.ndarray, onnx_shape: list[int]) -> np.ndarray:
    if list(y.shape) == list(onnx_shape):
        return y
    if y.ndim >= 3:
        t = y.transpose([0, y.ndim - 1, *range(1, y.ndim - 1)])
        if list(t.shape) == list(onnx_shape):
            return t
    return y.reshape(onnx_shape)


def tf_safe_names(src: Path, dst: Path) -> Path:
    """The model with node names TensorFlow accepts as scopes (PaddlePaddle's exports name nodes 'Softmax@0')."""
    import re

    import onnx

    m = onnx.load(str(src))
    for i, n in enumerate(m.graph.node):
        if n.name and not re.fullmatch(r"[A-Za-z0-9_.\\/>-]*", n.name):
            n.name = re.sub(r"[^A-Za-z0-9_./>-]", "_", n.name) + f"_{i}"
    onnx.save(m, str(dst))
    return dst


def quantize_onnx(onnx_path: Path, calib: dict[str, np.ndarray], work: Path) -> Path:
    """onnx2tf -> saved_model -> TFLite converter, full int8, calibrated on the spec's samples."""
    import tensorflow as tf

    onnx_path = tf_safe_names(onnx_path, work / "model.onnx")
    sm = work / "saved_model"
    sample = work / "calibration_image_sample_data_20x128x128x3_float32.npy"
    if not sample.exists():  # onnx2tf would download its own check image
        np.save(sample, np.random.default_rng(0).uniform(0, 1, (20, 128, 128, 3)).astype(np.float32))
    with open(work / "onnx2tf.log", "w") as f:
        proc = subprocess.run(["onnx2tf", "-i", str(onnx_path), "-o", str(sm), "-osd", "-n", "-rtpo", "Erf"],
                              cwd=work, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0 or not (sm / "saved_model.pb").exists():
        errors = [ln.strip() for ln in (work / "onnx2tf.log").read_text(errors="replace").splitlines()
                  if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln.strip())]  # onnx2tf's own reason, last
        raise RuntimeError(f"onnx2tf failed: {errors[-1] if errors else 'see ' + str(work / 'onnx2tf.log')}")
    sig = tf.saved_model.load(str(sm)).signatures["serving_default"]
    specs = sig.structured_input_signature[1]
    names = list(calib)

    def tf_name(onnx_name: str) -> str:
        key = onnx_name.replace(".", "_").replace("/", "_").replace(":", "_")
        for k in specs:
            if k == onnx_name or k == key:
                return k
        return list(specs)[names.index(onnx_name)]

    n = len(calib[names[0]])

    def gen():
        for i in range(n):
            yield {tf_name(k): to_tf_layout(calib[k][i], list(specs[tf_name(k)].shape)).astype(np.float32)
                   for k in names}

    conv = tf.lite.TFLiteConverter.from_saved_model(str(sm))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = gen
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    out = work / "model_int8.tflite"
    out.write_bytes(conv.convert())
    return out


def run_int8(tfl: Path, inputs: dict[str, np.ndarray], onnx_inputs: list[tuple[str, list[int]]],
             onnx_outputs: list[tuple[str, list[int]]]) -> dict[str, np.ndarray]:
    """The int8 model on every sample: dequantised outputs in ONNX layout, under the ONNX output names.

    Inputs and outputs are matched by name where the TFLite model kept the ONNX names (tf2onnx and onnx2tf
    do, up to a suffix), else by position."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        from tensorflow.lite.python.interpreter import Interpreter
    interp = Interpreter(model_path=str(tfl))
    interp.allocate_tensors()
    ins, outs = interp.get_input_details(), interp.get_output_details()

    def match(details: list[dict], names: list[str]) -> list[dict]:
        def norm(s: str) -> str:
            return s.split(":")[0].replace("serving_default_", "").replace("StatefulPartitionedCall_", "")
        by_name = {norm(d["name"]): d for d in details}
        if all(norm(n) in by_name for n in names):
            return [by_name[norm(n)] for n in names]
        return list(details)

    in_d = match(ins, [n for n, _ in onnx_inputs])
    out_d = match(outs, [n for n, _ in onnx_outputs])
    n = len(next(iter(inputs.values())))
    got: dict[str, list[np.ndarray]] = {name: [] for name, _ in onnx_outputs}
    for i in range(n):
        for (name, _shape), d in zip(onnx_inputs, in_d, strict=True):
            s, z = d["quantization"]
            x = to_tf_layout(inputs[name][i].astype(np.float64), list(d["shape"]))  # [1, ...] ONNX sample
            interp.set_tensor(d["index"], np.clip(np.round(x / s) + z, -128, 127).astype(np.int8))
        interp.invoke()
        for (name, shape), d in zip(onnx_outputs, out_d, strict=True):
            s, z = d["quantization"]
            y = (interp.get_tensor(d["index"]).astype(np.float64) - z) * s
            got[name].append(from_tf_layout(y, shape))
    return {k: np.stack(v) for k, v in got.items()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--original", type=Path, help="the model's original float .tflite")
    src.add_argument("--onnx", type=Path, help="the float ONNX model (onnx2tf route)")
    ap.add_argument("--float-onnx", type=Path, required=True, help="the fixed-shape ONNX model (I/O names, shapes)")
    ap.add_argument("--calib", type=Path, required=True)
    ap.add_argument("--eval", type=Path, help="held-back inputs (.npz keyed by ONNX input name)")
    ap.add_argument("--outputs", type=Path, help="where the int8 model's dequantised outputs go (.npz)")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--info", type=Path, required=True)
    args = ap.parse_args(argv)
    import onnx

    m = onnx.load(str(args.float_onnx), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    shape = lambda vi: [d.dim_value for d in vi.type.tensor_type.shape.dim]  # noqa: E731
    onnx_inputs = [(vi.name, shape(vi)) for vi in m.graph.input if vi.name not in inits]
    onnx_outputs = [(vi.name, shape(vi)) for vi in m.graph.output]
    args.work.mkdir(parents=True, exist_ok=True)
    shapes = dict(onnx_inputs)
    calib = {k: v.reshape(len(v), *shapes[k]) for k, v in load_arrays(args.calib, list(shapes)).items()}
    info: dict = {"route": "tflite-original" if args.original else "onnx2tf"}
    start = time.perf_counter()
    try:
        tfl = quantize_original(args.original, calib, args.work) if args.original else \
            quantize_onnx(args.onnx, calib, args.work)
        info["tflite"] = str(tfl)
        info["convert_s"] = round(time.perf_counter() - start, 2)
        if args.eval:
            with np.load(args.eval) as z:
                held = {k: z[k].reshape(len(z[k]), *shapes[k]) for k in z.files}
            np.savez(args.outputs, **run_int8(tfl, held, onnx_inputs, onnx_outputs))
            info["outputs"] = str(args.outputs)
    except Exception as exc:  # noqa: BLE001 - the route's failure is a row of the table
        info["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"
    args.info.write_text(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
