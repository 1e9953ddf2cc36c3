"""TFLite's own post-training int8 quantisation of a float .tflite original, run on evaluation inputs.

    TFPY bench/real_tflite.py MODEL.tflite CALIB.npy EVAL.npy OUT.npz

Run by bench/real_models.py with the python of a venv that has tensorflow-cpu (make_real.sh's `tfvenv`),
never imported by npubuild. It quantises the way TFLiteConverter's `optimizations=[DEFAULT]` with a
representative dataset does for a model it has converted to float TFLite already: the converter's own
calibrator (`tensorflow.lite.python.optimize.calibrator.Calibrator.calibrate_and_quantize`, the step the
converter runs after conversion), activations and weights int8, per-channel, int32 bias, float32 model
inputs and outputs (a QUANTIZE at entry and a DEQUANTIZE at exit, the same numbers an int8-interface model
gives). Every calibration sample is used, in file order.

Two things in the MediaPipe originals stop TFLite's calibrator (a segfault, an unresolved custom op), so
the model is first put in the form TFLiteConverter itself gives a float model: float16 weights behind
DEQUANTIZE ops become float32 constants (the same values: the converter's float output has no DEQUANTIZE),
and MediaPipe's custom `Convolution2DTransposeBias` (selfie segmentation) becomes the builtin
TRANSPOSE_CONV with its bias (same weights, OHWI, stride and SAME padding). A dynamic input (openWakeWord's)
is fixed to the data's shape first, as the ONNX files were: TFLite's int8 model of the dynamic original
crashes when its input is resized. The float outputs written are the rewritten model's; the bench checks
them against the ONNX model's. It writes the float original's and the int8
model's outputs on every evaluation sample (`float_<i>`, `int8_<i>`: output i in the interpreter's output
order, samples stacked; `float_names`, `int8_names` the output tensors' names in that order) and `error` (a one-line reason) when the original cannot be quantised or run.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def run_all(content: bytes, xs: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    import tensorflow as tf

    # TFLite's builtin kernels without the XNNPACK delegate, which crashes allocating the int8 log-mel model
    it = tf.lite.Interpreter(model_content=content,
                             experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    d = it.get_input_details()[0]
    it.resize_tensor_input(d["index"], list(xs.shape[1:]))
    it.allocate_tensors()
    outs = sorted(it.get_output_details(), key=lambda o: o["index"])
    got: list[list[np.ndarray]] = [[] for _ in outs]
    for x in xs:
        it.set_tensor(d["index"], x.astype(np.float32))
        it.invoke()
        for k, o in enumerate(outs):
            got[k].append(np.array(it.get_tensor(o["index"]), np.float32))
    return [o["name"] for o in outs], [np.stack(g) for g in got]


def as_converter_float(content: bytes, input_shape: tuple[int, ...] | None = None) -> bytes:
    """float16 weights -> float32 constants (DEQUANTIZE ops dropped); Convolution2DTransposeBias -> TRANSPOSE_CONV;
    a dynamic input made `input_shape` (TFLite's int8 model of a dynamic original crashes when resized)."""
    from tensorflow.lite.python import schema_py_generated as fb
    from tensorflow.lite.tools import flatbuffer_utils as fu

    m = fu.convert_bytearray_to_object(bytearray(content))
    codes = m.operatorCodes

    def builtin(op) -> int:
        c = codes[op.opcodeIndex]
        return max(c.builtinCode, c.deprecatedBuiltinCode)

    def code_index(op_code: int) -> int:
        for k, c in enumerate(codes):
            if max(c.builtinCode, c.deprecatedBuiltinCode) == op_code and not c.customCode:
                return k
        c = fb.OperatorCodeT()
        c.builtinCode, c.deprecatedBuiltinCode = op_code, min(op_code, 127)
        c.version = 3 if op_code == fb.BuiltinOperator.TRANSPOSE_CONV else 1
        codes.append(c)
        return len(codes) - 1

    if input_shape is not None:
        t = m.subgraphs[0].tensors[m.subgraphs[0].inputs[0]]
        t.shape, t.shapeSignature = list(input_shape), None
    for g in m.subgraphs:
        kept = []
        for op in g.operators:
            src = g.tensors[op.inputs[0]] if op.inputs is not None and len(op.inputs) else None
            if (builtin(op) == fb.BuiltinOperator.DEQUANTIZE and src is not None and src.type == fb.TensorType.FLOAT16
                    and m.buffers[src.buffer].data is not None):
                half = np.frombuffer(bytes(m.buffers[src.buffer].data), np.float16)
                dst = g.tensors[op.outputs[0]]
                buf = fb.BufferT()
                buf.data = np.frombuffer(half.astype(np.float32).tobytes(), np.uint8)
                m.buffers.append(buf)
                dst.buffer = len(m.buffers) - 1
                continue  # the output tensor is now a float32 constant
            c = codes[op.opcodeIndex]
            if c.customCode in (b"Convolution2DTransposeBias", "Convolution2DTransposeBias"):
                x, w, b = op.inputs
                out = g.tensors[op.outputs[0]]
                shape = fb.TensorT()
                shape.shape, shape.type, shape.name = [4], fb.TensorType.INT32, b"tconv_output_shape"
                buf = fb.BufferT()
                buf.data = np.frombuffer(np.asarray(out.shape, np.int32).tobytes(), np.uint8)
                m.buffers.append(buf)
                shape.buffer = len(m.buffers) - 1
                g.tensors.append(shape)
                opts = fb.TransposeConvOptionsT()
                opts.padding, opts.strideW, opts.strideH = fb.Padding.SAME, 2, 2
                op.opcodeIndex = code_index(fb.BuiltinOperator.TRANSPOSE_CONV)
                op.inputs = [len(g.tensors) - 1, w, x, b]
                op.builtinOptionsType, op.builtinOptions = fb.BuiltinOptions.TransposeConvOptions, opts
                op.customOptions = None
            kept.append(op)
        g.operators = kept
    used = sorted({op.opcodeIndex for g in m.subgraphs for op in g.operators})  # the calibrator's resolver
    remap = {old: new for new, old in enumerate(used)}  # refuses an opcode no op uses (DEQUANTIZE v2)
    m.operatorCodes = [codes[k] for k in used]
    for g in m.subgraphs:
        for op in g.operators:
            op.opcodeIndex = remap[op.opcodeIndex]
    return bytes(fu.convert_object_to_bytearray(m))


def main(model: str, calib: str, evals: str, out: str) -> int:
    import tensorflow as tf
    from tensorflow.lite.python.optimize import calibrator

    original = open(model, "rb").read()
    cal, ev = np.load(calib), np.load(evals)
    detail = tf.lite.Interpreter(model_content=original).get_input_details()[0]
    shape, fixed = tuple(int(d) for d in detail["shape"]), None
    if any(d < 0 for d in detail["shape_signature"]):  # a dynamic original (openWakeWord's): the data's shape
        shape = fixed = tuple(cal.shape[1:]) if cal.ndim - 1 == len(shape) else (1, *cal.shape[1:])
    content = as_converter_float(original, fixed)
    cal, ev = cal.reshape(-1, *shape), ev.reshape(-1, *shape)
    result: dict[str, np.ndarray] = {}
    try:
        flt_names, flt = run_all(content, ev)
        q = calibrator.Calibrator(content)

        def gen():
            for x in cal:
                yield [x[None].astype(np.float32) if x.shape != tuple(shape) else x.astype(np.float32)]

        int8 = q.calibrate_and_quantize(gen, tf.float32, tf.float32, False, activations_type=tf.int8)
        int8_names, got = run_all(int8, ev)
        result.update({f"float_{k}": v for k, v in enumerate(flt)}, float_names=np.array(flt_names))
        result.update({f"int8_{k}": v for k, v in enumerate(got)}, int8_names=np.array(int8_names))
    except Exception as exc:  # noqa: BLE001 - the bench reports why TFLite gives no figure
        result["error"] = np.array(" ".join(f"{type(exc).__name__}: {exc}".split())[:300])
    np.savez(out, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
