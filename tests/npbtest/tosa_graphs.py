"""Build small integer TOSA graphs directly (ops no ONNX lowering emits: ARGMAX, REVERSE, SCATTER, logic...)."""

from __future__ import annotations

import numpy as np
import tosa_serializer as ts

D = ts.DType
NP = {np.dtype(np.int8): D.INT8, np.dtype(np.int16): D.INT16, np.dtype(np.int32): D.INT32,
      np.dtype(np.int64): D.INT48, np.dtype(np.bool_): D.BOOL}


def attr(kind: str, *args) -> ts.TosaSerializerAttribute:
    a = ts.TosaSerializerAttribute()
    getattr(a, f"{kind}Attribute")(*args)
    return a


class Graph:
    """A TOSA 1.0 graph under construction; `io` describes its inputs the way the npu-sim helpers expect."""

    def __init__(self):
        self.s = ts.TosaSerializer("", ts.ConstMode.EMBED, 1, 0, 0, False)
        self.inputs: list[dict] = []
        self.last = ""  # the most recent operator's output
        self._n = 0

    def _name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}{self._n}"

    def input(self, shape: list[int], dtype) -> str:
        t = self.s.addPlaceholder(list(shape), NP[np.dtype(dtype)])
        self.inputs.append({"shape": list(shape), "dtype": np.dtype(dtype).name})
        return t.name

    def const(self, values, dtype=None, tosa_type=None) -> str:
        a = np.asarray(values, dtype)
        name = self._name("c")
        self.s.addConst(list(a.shape), tosa_type or NP[a.dtype], a, name=name)
        return name

    def shape(self, values: list[int]) -> str:
        name = self._name("shape")
        self.s.addConst([len(values)], D.SHAPE, np.asarray(values, np.int64), name=name)
        return name

    def zp(self, dtype, value: int = 0) -> str:
        return self.const(np.array([value], dtype))

    def op(self, op, inputs: list[str], shape: list[int], dtype, attribute, output: bool = False) -> str:
        t = (self.s.addOutput if output else self.s.addIntermediate)(list(shape), NP[np.dtype(dtype)])
        self.s.addOperator(op, inputs, [t.name], attribute)
        self.last = t.name
        return t.name

    def rescale(self, x: str, shape: list[int], in_dtype, out_dtype, mult: list[int], shift: list[int],
                in_zp: int = 0, out_zp: int = 0, output: bool = False, double_round: bool = True,
                in_unsigned: bool = False, out_unsigned: bool = False) -> str:
        """RESCALE (per channel when given one multiplier per channel); 48-bit inputs take 16-bit multipliers."""
        scale32 = np.dtype(in_dtype) != np.int64
        m = self.const(np.asarray(mult, np.int32 if scale32 else np.int16))
        sh = self.const(np.asarray(shift, np.int8))
        izp = self.const(np.array([in_zp], in_dtype))  # (an unsigned side reinterprets the int tensor)
        ozp = self.const(np.array([out_zp], out_dtype))
        mode = ts.RoundingMode.DOUBLE_ROUND if double_round and scale32 else ts.RoundingMode.SINGLE_ROUND
        return self.op(ts.Op.RESCALE, [x, m, sh, izp, ozp], shape, out_dtype,
                       attr("Rescale", scale32, mode, len(mult) > 1, in_unsigned, out_unsigned), output)

    def serialize(self) -> bytes:
        return self.s.serialize()

    @property
    def io(self) -> dict:
        return {"inputs": self.inputs}
