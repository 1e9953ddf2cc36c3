"""A TFLite subgraph under construction, on TFLite Micro's own model editor (no flatbuffer code of ours).

Tensors carry their numpy dtype and quantisation; operators their builtin options. `TflGraph.model` is the
model_editor Model, built to bytes by `build()`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tflite_micro.tensorflow.lite.micro.compression import model_editor as me
from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as tfl

TFL_TYPES = {np.dtype(np.float32): tfl.TensorType.FLOAT32, np.dtype(np.int8): tfl.TensorType.INT8,
             np.dtype(np.int16): tfl.TensorType.INT16, np.dtype(np.int32): tfl.TensorType.INT32,
             np.dtype(np.uint8): tfl.TensorType.UINT8, np.dtype(np.bool_): tfl.TensorType.BOOL,
             np.dtype(np.int64): tfl.TensorType.INT64}
NP_TYPES = {v: k for k, v in TFL_TYPES.items()}
BUILTIN_NAMES = {v: k for k, v in vars(tfl.BuiltinOperator).items() if not k.startswith("_")}


@dataclass(frozen=True)
class Quant:
    """Per-tensor affine quantisation: real = scale * (q - zero_point), codes of `dtype` (int8, or int16 in a
    build with 16-bit activations: TFLite's int16 tensors, zero point 0)."""

    scale: float
    zero_point: int
    dtype: str = "int8"

    def to_editor(self) -> me.Quantization:
        return me.Quantization(float(self.scale), int(self.zero_point))


def options(kind: str, **fields) -> tuple[int, object]:
    """(BuiltinOptions type, the options object) for `kind` (e.g. "Conv2D"), fields by their schema names."""
    obj = getattr(tfl, f"{kind}OptionsT")()
    for k, v in fields.items():
        if not hasattr(obj, k):
            raise AttributeError(f"{kind}Options has no field {k}")
        setattr(obj, k, v)
    return getattr(tfl.BuiltinOptions, f"{kind}Options"), obj


class TflGraph:
    """One subgraph; tensors by name."""

    def __init__(self, description: str = "npubuild"):
        self.model = me.Model(description=description)
        self.sg = self.model.add_subgraph(name="main")
        self.tensors: dict[str, me.Tensor] = {}
        self.blocked: set[int] = set()  # tensors in an NPU partition's arena block (assemble.py)
        self._n = 0

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}__{self._n}"

    def tensor(self, name: str, shape, dtype, quant: Quant | None = None) -> me.Tensor:
        t = self.sg.add_tensor(shape=tuple(int(d) for d in shape), dtype=TFL_TYPES[np.dtype(dtype)], name=name,
                               quantization=quant.to_editor() if quant else None)
        self.tensors[name] = t
        return t

    def const(self, value: np.ndarray, hint: str = "const", quant: Quant | None = None) -> me.Tensor:
        value = np.ascontiguousarray(value)
        name = self.fresh(hint)
        t = self.sg.add_tensor(shape=value.shape, dtype=TFL_TYPES[value.dtype], name=name, data=value,
                               quantization=quant.to_editor() if quant else None)
        self.tensors[name] = t
        return t

    def op(self, code: int, inputs: list[me.Tensor | None], outputs: list[me.Tensor],
           opts: tuple[int, object] | None = None) -> me.Operator:
        op = self.sg.add_operator(opcode=code, inputs=list(inputs), outputs=list(outputs))
        if opts is not None:
            op._fb.builtinOptionsType, op._fb.builtinOptions = opts
        return op

    def build(self) -> bytes:
        return bytes(self.model.build())


def builtin_name(code: int) -> str:
    return BUILTIN_NAMES.get(code, f"builtin {code}")
