"""How one TOSA graph input or output maps to the ONNX tensor it stands for: name, layout, dtype, quantisation.

Every stage that feeds a TOSA graph or reads one back (the TOSA check, the partition check, the FVP,
npu-sim, the firmware manifest, `npubuild simulate`) converts through IOSpec, so a float ONNX tensor is
quantised, laid out and dequantised in one way everywhere. The rounding is the one the QDQ model's
QuantizeLinear uses as onnxruntime runs it on the CPU: divide, round half to even, add the zero point,
saturate. The lowering's own rounding helpers (lowering/quant.QParams.quantize for constants,
lowering/table.quantize_like_ort for TABLE entries) work on QParams inside one lowering and are not
about graph I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

NHWC = (0, 2, 3, 1)  # physical NHWC of a logical NCHW tensor
UNQUANTIZED = ("float32", "bool")


@dataclass(frozen=True)
class IOSpec:
    """One TOSA graph input/output: its ONNX name, physical shape, layout (physical = onnx.transpose(perm)),
    storage dtype and, for integer tensors, scale and zero point (real = scale * (q - zero_point))."""

    onnx_name: str
    tosa_name: str
    shape: tuple[int, ...]  # physical (TOSA) shape
    perm: tuple[int, ...]
    dtype: str
    scale: float | None = None
    zero_point: int | None = None

    def __post_init__(self) -> None:  # lists from JSON, numpy ints from the lowering: one form to compare
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "perm", tuple(int(p) for p in self.perm))

    # ------------------------------------------------------------------ io.json

    def to_json(self) -> dict[str, Any]:
        """The dict io.json has always held (same keys, same order)."""
        return {"onnx_name": self.onnx_name, "tosa_name": self.tosa_name, "shape": list(self.shape),
                "perm": list(self.perm), "dtype": self.dtype, "scale": self.scale, "zero_point": self.zero_point}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> IOSpec:
        return cls(d["onnx_name"], d["tosa_name"], tuple(d["shape"]), tuple(d["perm"]), d["dtype"],
                   d.get("scale"), d.get("zero_point"))

    def renamed(self, onnx_name: str) -> IOSpec:
        return replace(self, onnx_name=onnx_name)

    # ------------------------------------------------------------------ layout

    @property
    def onnx_shape(self) -> tuple[int, ...]:
        """The shape in ONNX's layout (the physical shape with the layout permutation undone)."""
        return tuple(self.shape[int(i)] for i in np.argsort(self.perm))

    @property
    def is_nhwc(self) -> bool:
        return self.perm == NHWC

    @property
    def layout(self) -> str:
        """How the reports and the firmware manifest name the layout."""
        return "NHWC" if self.is_nhwc else "as ONNX"

    @property
    def quantized(self) -> bool:
        """Whether the graph holds this tensor as integers on a scale (float and bool tensors are as they are)."""
        return self.dtype not in UNQUANTIZED and self.scale is not None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    # ------------------------------------------------------------------ values

    def _codes(self, x: np.ndarray) -> np.ndarray:
        """round(x / scale) + zero_point saturated to the dtype, still a float array in x's own precision."""
        assert self.scale is not None and self.zero_point is not None, f"'{self.onnx_name}' has no quantisation"
        info = np.iinfo(np.dtype(self.dtype))
        return np.clip(np.round(x / self.scale) + self.zero_point, info.min, info.max)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """Real values (any layout) -> this tensor's integers; the division runs in x's precision."""
        return self._codes(x).astype(self.dtype)

    def to_tosa(self, x: np.ndarray) -> np.ndarray:
        """An ONNX-layout float array -> what the TOSA graph takes: physical layout, quantised unless float."""
        x = np.transpose(np.asarray(x), self.perm)
        if self.dtype != "float32":
            x = self._codes(x)
        return np.ascontiguousarray(x.astype(self.dtype)).reshape(np.shape(x))  # rank 0 stays rank 0

    def from_tosa(self, y: np.ndarray) -> np.ndarray:
        """A physical-layout array from the graph -> ONNX layout (values untouched)."""
        return np.transpose(np.asarray(y), tuple(int(i) for i in np.argsort(self.perm)))

    def dequantize(self, y: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        """Raw integers -> real values: float64 to measure errors; float32 (as onnxruntime computes
        DequantizeLinear) to feed a host partition. An unquantized tensor is only cast."""
        if not self.quantized:
            return np.asarray(y).astype(dtype)
        return ((np.asarray(y).astype(np.float64) - self.zero_point) * self.scale).astype(dtype)

    def through_qdq(self, x: np.ndarray) -> np.ndarray:
        """x after QuantizeLinear -> DequantizeLinear, in x's own precision (an input's quantisation error)."""
        return (self._codes(x) - self.zero_point) * self.scale

    def quantize_reference(self, ref: np.ndarray) -> np.ndarray:
        """onnxruntime's output of the QDQ model on this tensor's grid (float, unsaturated: a reference that
        leaves the range shows up as error rather than being clipped into agreement)."""
        assert self.scale is not None and self.zero_point is not None, f"'{self.onnx_name}' has no quantisation"
        return np.round(ref / self.scale) + self.zero_point

    def lsb_error(self, ref: np.ndarray, got: np.ndarray) -> np.ndarray:
        """|quantise(ref) - got| in units of the output's LSB, ref quantised in float64 and saturated as the
        QDQ model's final QuantizeLinear would."""
        return np.abs(self._codes(np.asarray(ref, np.float64)) - np.asarray(got, np.float64))

    def representable_range(self) -> tuple[float, float] | None:
        """The real range the integer dtype covers on this scale (the calibrated range); None for floats."""
        if not self.quantized:
            return None
        assert self.zero_point is not None and self.scale is not None
        info = np.iinfo(np.dtype(self.dtype))
        return (info.min - self.zero_point) * self.scale, (info.max - self.zero_point) * self.scale


class GraphIO(Protocol):
    """Anything that names a TOSA graph's inputs and outputs in placeholder/output order (the lower stage's
    record, one NPU partition's io, the lowering's own result)."""

    @property
    def inputs(self) -> Sequence[IOSpec]: ...

    @property
    def outputs(self) -> Sequence[IOSpec]: ...


@dataclass(frozen=True)
class GraphSpecs:
    """A plain GraphIO: the inputs and outputs of one TOSA graph."""

    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]


def specs_to_json(specs: Sequence[IOSpec]) -> list[dict[str, Any]]:
    return [s.to_json() for s in specs]


def specs_from_json(items: Sequence[Mapping[str, Any]]) -> tuple[IOSpec, ...]:
    return tuple(IOSpec.from_json(d) for d in items)
